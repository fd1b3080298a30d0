package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// payloadSize is the size of every raw message: about a Warden task or
// result (a task with small params is ~250 bytes of JSON plus headers).
const payloadSize = 256

// runRaw measures plain JetStream on the same server settings Warden uses:
// a file-storage R1 stream and a KV bucket.
func (e *Env) runRaw(tb *runTB) {
	srv := e.startServer(tb)
	_, js := connect(tb, srv.URL, "bench-raw")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw.>"},
		Storage: jetstream.FileStorage, Replicas: 1, Retention: jetstream.WorkQueuePolicy}); err != nil {
		tb.Fatalf("create stream: %v", err)
	}
	payload := filler(payloadSize)
	dur := pick(e, 3*time.Second, time.Second)
	const sec = "raw JetStream"

	// Synchronous publish: one PubAck before the next publish.
	var lat []time.Duration
	start := time.Now()
	for time.Since(start) < dur {
		t0 := time.Now()
		if _, err := js.Publish(ctx, "raw.sync", payload); err != nil {
			tb.Fatalf("publish: %v", err)
		}
		lat = append(lat, time.Since(t0))
	}
	rate := float64(len(lat)) / time.Since(start).Seconds()
	e.rep.Add(Figure{Section: sec, Key: "raw_sync_publish_per_s", Label: "sync publish", Value: rate, Unit: "msgs/s",
		Note: fmt.Sprintf("p50 %.3f ms, p99 %.3f ms, %d B", ms(percentile(lat, 50)), ms(percentile(lat, 99)), payloadSize)})
	e.rep.Add(Figure{Section: sec, Key: "raw_sync_publish_p50_ms", Label: "sync publish p50", Value: ms(percentile(lat, 50)), Unit: "ms"})
	e.rep.Add(Figure{Section: sec, Key: "raw_sync_publish_p99_ms", Label: "sync publish p99", Value: ms(percentile(lat, 99)), Unit: "ms"})
	e.logf("raw: sync publish %.0f/s", rate)

	// Asynchronous publish: up to 4096 PubAcks outstanding.
	n := pick(e, 200000, 50000)
	meter := newCPUMeter(map[string]int{"server": srv.PID()})
	start = time.Now()
	for i := 0; i < n; i++ {
		if _, err := js.PublishAsync("raw.async", payload, jetstream.WithStallWait(stallWait)); err != nil {
			tb.Fatalf("publish async: %v", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		tb.Fatalf("async publishes not acknowledged")
	}
	rate = float64(n) / time.Since(start).Seconds()
	srvCores := meter.Cores()["server"]
	e.rep.Add(Figure{Section: sec, Key: "raw_async_publish_per_s", Label: "async publish", Value: rate, Unit: "msgs/s",
		Note: fmt.Sprintf("%d msgs, %d B; nats-server %.2f cores meanwhile", n, payloadSize, srvCores)})
	e.rep.Add(Figure{Section: sec, Key: "raw_async_publish_server_cpu_cores", Label: "nats-server CPU during async publish", Value: srvCores, Unit: "cores"})
	e.logf("raw: async publish %.0f/s", rate)

	// Pull consume with explicit acks (acks are not requests: the
	// server-side rate, as Warden's scheduler acks).
	cons, err := js.CreateOrUpdateConsumer(ctx, "RAW", jetstream.ConsumerConfig{Durable: "raw", FilterSubject: "raw.async",
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 8192})
	if err != nil {
		tb.Fatalf("consumer: %v", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		tb.Fatalf("messages: %v", err)
	}
	start = time.Now()
	for i := 0; i < n; i++ {
		m, err := it.Next()
		if err != nil {
			tb.Fatalf("next: %v", err)
		}
		if err := m.Ack(); err != nil {
			tb.Fatalf("ack: %v", err)
		}
	}
	it.Stop()
	rate = float64(n) / time.Since(start).Seconds()
	e.rep.Add(Figure{Section: sec, Key: "raw_consume_ack_per_s", Label: "pull consume + ack", Value: rate, Unit: "msgs/s",
		Note: "explicit ack, work-queue stream"})
	e.logf("raw: consume+ack %.0f/s", rate)

	// KV put, synchronous.
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "raw", Storage: jetstream.FileStorage, Replicas: 1})
	if err != nil {
		tb.Fatalf("kv: %v", err)
	}
	lat = lat[:0]
	start = time.Now()
	for i := 0; time.Since(start) < dur; i++ {
		t0 := time.Now()
		if _, err := kv.Put(ctx, fmt.Sprintf("k.%d", i%1000), payload); err != nil {
			tb.Fatalf("kv put: %v", err)
		}
		lat = append(lat, time.Since(t0))
	}
	rate = float64(len(lat)) / time.Since(start).Seconds()
	e.rep.Add(Figure{Section: sec, Key: "raw_kv_put_per_s", Label: "KV put (sync)", Value: rate, Unit: "puts/s",
		Note: fmt.Sprintf("p50 %.3f ms, p99 %.3f ms", ms(percentile(lat, 50)), ms(percentile(lat, 99)))})
	e.rep.Add(Figure{Section: sec, Key: "raw_kv_put_p99_ms", Label: "KV put p99", Value: ms(percentile(lat, 99)), Unit: "ms"})
	e.logf("raw: kv put %.0f/s", rate)
}

// filler is n bytes of letters: a message body of a given size.
func filler(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return b
}
