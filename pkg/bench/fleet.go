package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// FleetConfig configures a fleet of light agents: simulated agents, many
// per process, sharing a few connections. Each one follows
// docs/protocol.md: it announces its presence with Create and heartbeats it
// every second with a compare-and-set update; it owns a durable task
// consumer on its shard; its no-op handler publishes a result, waits for
// the PubAck and only then acks the task.
//
// Differences from pkg/agent, to keep thousands in one process: the
// heartbeat and the result are published asynchronously (the PubAck is
// still awaited before the ack), the routing fields are read from the
// task's headers, the ack is not a request, and there is no lease
// extension (the no-op handler never needs one).
type FleetConfig struct {
	URL  string
	Pool string
	// Prefix names the agents <prefix>-<n>. Defaults to "la".
	Prefix string
	Agents int
	// Shards must match the scheduler's task_shards.
	Shards int
	// MaxConcurrent is each agent's max_ack_pending. Defaults to 4.
	MaxConcurrent int
	// AgentsPerConn is how many agents share a connection. Defaults to 250.
	AgentsPerConn int
	// Heartbeat is the presence interval. Defaults to 1s.
	Heartbeat time.Duration
	// Lease is the task consumer's ack wait. Defaults to 10s.
	Lease time.Duration
	// Actions the agents announce. Defaults to ["noop"].
	Actions []string
	// OnTask is called when a task arrives (for latency measurements).
	OnTask func(job string, at time.Time)
}

// Fleet is a running set of light agents.
type Fleet struct {
	cfg      FleetConfig
	conns    []*fleetConn
	agents   []*lightAgent
	handled  atomic.Uint64
	failed   atomic.Uint64
	hbWrites atomic.Uint64
	hbErrors atomic.Uint64
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

type fleetConn struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	acks chan pendingAck
}

type pendingAck struct {
	fut jetstream.PubAckFuture
	msg jetstream.Msg
}

type lightAgent struct {
	f        *Fleet
	id, key  string
	conn     *fleetConn
	presence protocol.Presence
	rev      atomic.Uint64
	inFlight atomic.Int32
	cc       jetstream.ConsumeContext
}

// StartFleet connects, creates every agent's consumer and presence (in
// parallel), and starts consuming and heartbeating.
func StartFleet(ctx context.Context, cfg FleetConfig) (*Fleet, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "la"
	}
	if cfg.Pool == "" {
		cfg.Pool = "default"
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 4
	}
	if cfg.AgentsPerConn <= 0 {
		cfg.AgentsPerConn = 250
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = time.Second
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 10 * time.Second
	}
	if cfg.Shards <= 0 {
		cfg.Shards = streams.DefaultTaskShards
	}
	if len(cfg.Actions) == 0 {
		cfg.Actions = []string{"noop"}
	}
	runCtx, cancel := context.WithCancel(context.Background())
	f := &Fleet{cfg: cfg, cancel: cancel}
	nconns := (cfg.Agents + cfg.AgentsPerConn - 1) / cfg.AgentsPerConn
	for i := 0; i < nconns; i++ {
		nc, err := nats.Connect(cfg.URL, nats.Name(fmt.Sprintf("bench-fleet-%d", i)), nats.MaxReconnects(-1),
			nats.ReconnectBufSize(64<<20))
		if err != nil {
			f.Stop()
			return nil, err
		}
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(16384))
		if err != nil {
			f.Stop()
			return nil, err
		}
		c := &fleetConn{nc: nc, js: js, acks: make(chan pendingAck, 1<<16)}
		f.conns = append(f.conns, c)
		f.wg.Add(1)
		go f.acker(runCtx, c)
	}
	host, _ := os.Hostname()
	now := time.Now().UTC()
	for i := 0; i < cfg.Agents; i++ {
		id := fmt.Sprintf("%s-%d", cfg.Prefix, i)
		shard := protocol.Shard(cfg.Pool, id, cfg.Shards)
		a := &lightAgent{f: f, id: id, key: protocol.PresenceKey(cfg.Pool, id), conn: f.conns[i/cfg.AgentsPerConn]}
		a.presence = protocol.Presence{ID: id, Pool: cfg.Pool, Actions: cfg.Actions, MaxConcurrent: cfg.MaxConcurrent,
			Version: "bench-light", Host: host, PID: os.Getpid(), TaskStream: protocol.TaskStream(shard),
			TaskSubject: protocol.TaskSubject(shard, cfg.Pool, id), StartedAt: now}
		f.agents = append(f.agents, a)
	}
	// Heartbeats start now, for each agent as soon as it has announced
	// itself: starting thousands takes longer than the presence TTL.
	f.wg.Add(1)
	go f.heartbeats(runCtx)
	// Start agents with a bounded number of concurrent set-up requests.
	work := make(chan *lightAgent)
	errc := make(chan error, 1)
	var setup sync.WaitGroup
	for w := 0; w < 32; w++ {
		setup.Add(1)
		go func() {
			defer setup.Done()
			for a := range work {
				if err := a.start(ctx); err != nil {
					select {
					case errc <- fmt.Errorf("agent %s: %w", a.id, err):
					default:
					}
				}
			}
		}()
	}
	for _, a := range f.agents {
		work <- a
	}
	close(work)
	setup.Wait()
	select {
	case err := <-errc:
		f.Stop()
		return nil, err
	default:
	}
	return f, nil
}

// IDs returns the agents' ids.
func (f *Fleet) IDs() []string {
	out := make([]string, len(f.agents))
	for i, a := range f.agents {
		out[i] = a.id
	}
	return out
}

// Handled is the number of tasks whose result was stored and acked.
func (f *Fleet) Handled() uint64 { return f.handled.Load() }

// HeartbeatWrites is the number of heartbeats stored.
func (f *Fleet) HeartbeatWrites() uint64 { return f.hbWrites.Load() }

// HeartbeatErrors counts failed heartbeats.
func (f *Fleet) HeartbeatErrors() uint64 { return f.hbErrors.Load() }

// Stop stops consuming and heartbeating and closes the connections. The
// presence keys are left to expire, as after a crash.
func (f *Fleet) Stop() {
	for _, a := range f.agents {
		if a.cc != nil {
			a.cc.Stop()
		}
	}
	f.cancel()
	for _, c := range f.conns {
		c.nc.Close()
	}
	f.wg.Wait()
}

func (a *lightAgent) start(ctx context.Context) error {
	shard := protocol.Shard(a.f.cfg.Pool, a.id, a.f.cfg.Shards)
	cc, err := streams.TaskConsumer(shard, a.f.cfg.Pool, a.id, a.f.cfg.Lease, 5, a.f.cfg.MaxConcurrent)
	if err != nil {
		return err
	}
	cons, err := a.conn.js.CreateOrUpdateConsumer(ctx, protocol.TaskStream(shard), cc)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	kv, err := a.conn.js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		return fmt.Errorf("presence bucket: %w", err)
	}
	p := a.presence
	p.HeartbeatAt = time.Now().UTC()
	b, _ := json.Marshal(p)
	rev, err := kv.Create(ctx, a.key, b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		rev, err = kv.Put(ctx, a.key, b)
	}
	if err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	a.rev.Store(rev)
	a.cc, err = cons.Consume(a.handle, jetstream.PullMaxMessages(a.f.cfg.MaxConcurrent))
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	return nil
}

// handle is the no-op handler: report success, ack after the PubAck.
func (a *lightAgent) handle(m jetstream.Msg) {
	now := time.Now()
	h := m.Headers()
	job, step := h.Get(protocol.HeaderJob), h.Get(protocol.HeaderStep)
	epoch, _ := strconv.ParseUint(h.Get(protocol.HeaderEpoch), 10, 64)
	if a.f.cfg.OnTask != nil {
		a.f.cfg.OnTask(job, now)
	}
	if dl, err := time.Parse(time.RFC3339Nano, h.Get(protocol.HeaderDeadline)); err == nil && now.After(dl) {
		_ = m.Term() // never report after the deadline
		return
	}
	a.inFlight.Add(1)
	r := protocol.Result{JobID: job, StepID: step, Epoch: epoch, Agent: a.id, Status: protocol.ResultSucceeded,
		StartedAt: now.UTC(), FinishedAt: time.Now().UTC()}
	b, _ := json.Marshal(r)
	out := nats.NewMsg(protocol.ResultSubject(job, step))
	out.Data = b
	out.Header.Set(protocol.HeaderJob, job)
	out.Header.Set(protocol.HeaderStep, step)
	out.Header.Set(protocol.HeaderEpoch, strconv.FormatUint(epoch, 10))
	out.Header.Set(protocol.HeaderAgent, a.id)
	out.Header.Set(protocol.HeaderMsgID, protocol.ResultMsgID(job, step, epoch))
	fut, err := a.conn.js.PublishMsgAsync(out)
	if err != nil {
		a.inFlight.Add(-1)
		a.f.failed.Add(1)
		_ = m.Nak()
		return
	}
	a.conn.acks <- pendingAck{fut: fut, msg: m}
	a.inFlight.Add(-1)
}

// acker acks tasks in order once their result's PubAck arrived.
func (f *Fleet) acker(ctx context.Context, c *fleetConn) {
	defer f.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-c.acks:
			select {
			case <-p.fut.Ok():
				_ = p.msg.Ack()
				f.handled.Add(1)
			case <-p.fut.Err():
				f.failed.Add(1)
				_ = p.msg.Nak()
			case <-ctx.Done():
				return
			}
		}
	}
}

// heartbeats spreads every agent's heartbeat over the interval in ten
// slices; each is a CAS update of the agent's key, published asynchronously.
func (f *Fleet) heartbeats(ctx context.Context) {
	defer f.wg.Done()
	const slices = 10
	tick := time.NewTicker(f.cfg.Heartbeat / slices)
	defer tick.Stop()
	type sent struct {
		a   *lightAgent
		fut jetstream.PubAckFuture
	}
	var batch []sent
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		batch = batch[:0]
		now := time.Now().UTC()
		for i := n % slices; i < len(f.agents); i += slices {
			a := f.agents[i]
			if a.rev.Load() == 0 {
				continue // not announced yet
			}
			p := a.presence
			p.HeartbeatAt = now
			p.InFlight = int(a.inFlight.Load())
			b, _ := json.Marshal(p)
			m := nats.NewMsg("$KV." + protocol.BucketPresence + "." + a.key)
			m.Data = b
			fut, err := a.conn.js.PublishMsgAsync(m, jetstream.WithExpectLastSequencePerSubject(a.rev.Load()))
			if err != nil {
				f.hbErrors.Add(1)
				continue
			}
			batch = append(batch, sent{a, fut})
		}
		timeout := time.NewTimer(f.cfg.Heartbeat)
		for _, s := range batch {
			select {
			case ack := <-s.fut.Ok():
				s.a.rev.Store(ack.Sequence)
				f.hbWrites.Add(1)
			case <-s.fut.Err():
				// A CAS loss would mean another process took the key; in
				// the bench it means our revision is stale after a
				// timeout: count it and resynchronise.
				f.hbErrors.Add(1)
				if e, err := s.a.conn.js.KeyValue(ctx, protocol.BucketPresence); err == nil {
					if cur, err := e.Get(ctx, s.a.key); err == nil {
						s.a.rev.Store(cur.Revision())
					}
				}
			case <-timeout.C:
				f.hbErrors.Add(1)
			case <-ctx.Done():
				timeout.Stop()
				return
			}
		}
		timeout.Stop()
	}
}
