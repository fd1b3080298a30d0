package events_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Issue 15: a deposed leader published a duplicate agent_failed event. Every
// event now carries a Nats-Msg-Id derived from what it describes (not from
// when, or by whom, it was published), so the stream stores a repeat once.
func TestEventsDescribedTwiceAreStoredOnce(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	p := events.NewPublisher(js)
	failed := protocol.Event{Kind: protocol.EventAgentFailed, ID: "a1", Agent: "a1", Reason: "presence expired",
		Data: map[string]string{"pool": "default", "trigger": "departed:t1"}}
	first, second := failed, failed
	first.Time, second.Time = time.Unix(1, 0), time.Unix(2, 0) // two leaders, two clocks
	recovered := func(epoch string) protocol.Event {
		return protocol.Event{Kind: protocol.EventStepRecovered, ID: "j", JobID: "j", StepID: "s", Agent: "a1",
			Reason: "lease expired", Data: map[string]string{"epoch": epoch}}
	}
	for _, e := range []protocol.Event{first, second, recovered("1"), recovered("1"), recovered("2")} {
		if err := p.Publish(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// A failover record measured twice (durations differ) is one failover.
	for _, d := range []string{"1ms", "2ms"} {
		e := protocol.Event{Kind: protocol.EventFailover, ID: "fo-1", Agent: "a1", Data: map[string]string{"duration": d}}
		if err := p.PublishOnce(ctx, e, "fo-1"); err != nil {
			t.Fatal(err)
		}
	}
	count := func(kind protocol.EventKind) int {
		evs, err := events.List(ctx, js, kind, 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(evs)
	}
	if n := count(protocol.EventAgentFailed); n != 1 {
		t.Errorf("agent_failed stored %d times, want once", n)
	}
	if n := count(protocol.EventStepRecovered); n != 2 {
		t.Errorf("step_recovered stored %d times, want once per epoch (2)", n)
	}
	if n := count(protocol.EventFailover); n != 1 {
		t.Errorf("failover stored %d times, want once", n)
	}
}

func TestMsgIDIgnoresTimeAndDataOrder(t *testing.T) {
	t.Parallel()
	a := protocol.Event{Kind: protocol.EventHealing, ID: "a", Data: map[string]string{"x": "1", "y": "2"}, Time: time.Unix(1, 0)}
	b := protocol.Event{Kind: protocol.EventHealing, ID: "a", Data: map[string]string{"y": "2", "x": "1"}, Time: time.Unix(9, 0)}
	c := protocol.Event{Kind: protocol.EventHealing, ID: "a", Data: map[string]string{"x": "1", "y": "3"}}
	if events.MsgID(a) != events.MsgID(b) {
		t.Errorf("same event, different ids: %s %s", events.MsgID(a), events.MsgID(b))
	}
	if events.MsgID(a) == events.MsgID(c) {
		t.Errorf("different events, same id %s", events.MsgID(a))
	}
	if odd := (protocol.Event{Kind: protocol.EventResultRejected, ID: "not a token"}); events.MsgID(odd)[:len("result_rejected._.")] != "result_rejected._." {
		t.Errorf("id of an event about no valid token: %s", events.MsgID(odd))
	}
}

// publishN stores n events of kind (ids <prefix>0 ...), Data["n"] their
// number, oldest first.
func publishN(t *testing.T, p *events.Publisher, kind protocol.EventKind, prefix string, n int) {
	t.Helper()
	for i := range n {
		e := protocol.Event{Kind: kind, ID: fmt.Sprint(prefix, i), Data: map[string]string{"n": fmt.Sprint(i)}}
		if err := p.Publish(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
}

// wantTail checks that evs are the events numbered from-1 ... to-1 (Data["n"]),
// in that order.
func wantTail(t *testing.T, evs []protocol.Event, from, to int) {
	t.Helper()
	if len(evs) != to-from {
		t.Fatalf("%d events, want %d (numbers %d to %d)", len(evs), to-from, from, to-1)
	}
	for i, e := range evs {
		if e.Data["n"] != fmt.Sprint(from+i) {
			t.Fatalf("event %d is number %s, want %d (the newest, oldest first)", i, e.Data["n"], from+i)
		}
	}
}

// consumerCreations counts the consumers created on WARDEN_EVENTS while
// read runs, from the server's advisories. It then creates one of its own
// and waits for its advisory: the server sends advisories in order, so
// every creation during read has been counted by then.
func consumerCreations(t *testing.T, nc *nats.Conn, js jetstream.JetStream, read func()) int {
	t.Helper()
	var mu sync.Mutex
	var created []string
	sub, err := nc.Subscribe("$JS.EVENT.ADVISORY.CONSUMER.CREATED.>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		created = append(created, m.Subject)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	read()
	const marker = "count-marker"
	markerSubject := "$JS.EVENT.ADVISORY.CONSUMER.CREATED." + protocol.StreamEvents + "." + marker
	if _, err := js.CreateConsumer(context.Background(), protocol.StreamEvents,
		jetstream.ConsumerConfig{Name: marker, AckPolicy: jetstream.AckNonePolicy}); err != nil {
		t.Fatal(err)
	}
	n := 0
	natstest.Eventually(t, 10*time.Second, "marker consumer's advisory", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n = 0
		for _, s := range created {
			switch {
			case s == markerSubject:
				return true
			case strings.HasPrefix(s, "$JS.EVENT.ADVISORY.CONSUMER.CREATED."+protocol.StreamEvents+"."):
				n++
			}
		}
		return false
	})
	if err := js.DeleteConsumer(context.Background(), protocol.StreamEvents, marker); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestListReadsOnlyTheTail: List of the last 10 of 2,000 events reads them
// with one consumer. It used to call Next on an ordered consumer, which
// creates a new server consumer for every call: one per event stored, all
// 2,000 read and held to keep 10.
func TestListReadsOnlyTheTail(t *testing.T) {
	t.Parallel()
	_, nc, js := natstest.Start(t, streams.Options{})
	p := events.NewPublisher(js)
	publishN(t, p, protocol.EventHealing, "h", 2000)
	publishN(t, p, protocol.EventFailover, "f", 3) // another kind after them
	var evs []protocol.Event
	n := consumerCreations(t, nc, js, func() {
		var err error
		if evs, err = events.List(context.Background(), js, protocol.EventHealing, 10); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%d consumer(s) created to list 10 of 2,000 events", n)
	if n > 2 {
		t.Errorf("%d consumers created to list 10 events, want at most 2", n)
	}
	wantTail(t, evs, 1990, 2000)
	// and leaves none behind (the marker is gone too).
	stream, err := js.Stream(context.Background(), protocol.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	for name := range stream.ListConsumers(context.Background()).Info() {
		t.Errorf("consumer %s left on %s", name.Name, protocol.StreamEvents)
	}
	all, err := events.List(context.Background(), js, protocol.EventHealing, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantTail(t, all, 0, 2000)
}

// TestListRareKind: the kind asked for is one message in a hundred, so the
// last messages of the stream hold fewer than limit of it; List looks
// further back (a few consumers, not one per event) and still returns the
// newest limit, oldest first.
func TestListRareKind(t *testing.T) {
	t.Parallel()
	_, nc, js := natstest.Start(t, streams.Options{})
	p := events.NewPublisher(js)
	for i := range 12 {
		publishN(t, p, protocol.EventFailover, fmt.Sprint("f", i, "-"), 99)
		e := protocol.Event{Kind: protocol.EventHealing, ID: fmt.Sprint("h", i), Data: map[string]string{"n": fmt.Sprint(i)}}
		if err := p.Publish(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	var evs []protocol.Event
	n := consumerCreations(t, nc, js, func() {
		var err error
		if evs, err = events.List(context.Background(), js, protocol.EventHealing, 5); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%d consumer(s) created to list 5 of 12 events among 1,200", n)
	if n > 4 {
		t.Errorf("%d consumers created to list 5 events, want at most 4", n)
	}
	wantTail(t, evs, 7, 12)
	none, err := events.List(context.Background(), js, protocol.EventDeadLettered, 5)
	if err != nil || len(none) != 0 {
		t.Fatalf("a kind never published: %v, %v", none, err)
	}
}

// TestListOverSlowLink: the server's answers take 1.5 s to arrive. List
// used to give each event 300 ms and end the read, without an error, at
// the first that took longer: here an empty list, as if there were no
// events. It must read them all, or fail.
func TestListOverSlowLink(t *testing.T) {
	t.Parallel()
	srv, _, js := natstest.Start(t, streams.Options{})
	publishN(t, events.NewPublisher(js), protocol.EventHealing, "h", 50)
	addr := delayingProxy(t, strings.TrimPrefix(srv.URL, "nats://"), 1500*time.Millisecond)
	slow, err := nats.Connect("nats://"+addr, nats.Timeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(slow.Close)
	sjs, err := jetstream.New(slow, jetstream.WithDefaultTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	evs, err := events.List(context.Background(), sjs, protocol.EventHealing, 0)
	if err != nil {
		t.Fatalf("list over a slow link: %v", err)
	}
	wantTail(t, evs, 0, 50)
}

// delayingProxy forwards TCP connections to target, holding everything the
// server sends for delay before passing it on (in order), as a slow
// network or an overloaded server would. It returns its address.
func delayingProxy(t *testing.T, target string, delay time.Duration) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := l.Accept()
			if err != nil {
				return // closed at cleanup
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				_ = client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			type chunk struct {
				at   time.Time
				data []byte
			}
			q := make(chan chunk, 4096)
			wg.Add(3)
			go func() { defer wg.Done(); _, _ = io.Copy(server, client) }()
			go func() {
				defer wg.Done()
				defer close(q)
				for {
					b := make([]byte, 32*1024)
					n, err := server.Read(b)
					if n > 0 {
						q <- chunk{time.Now().Add(delay), b[:n]}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				for c := range q {
					time.Sleep(time.Until(c.at))
					if _, err := client.Write(c.data); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}
