package presence

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Change is one update a View saw.
type Change struct {
	Key      string
	Presence protocol.Presence
	// Gone is true when the key was deleted or expired.
	Gone bool
	// Expired is true when the bucket's TTL removed the key (the agent
	// stopped heartbeating), as opposed to a clean delete on shutdown.
	Expired bool
}

// View keeps the present agents in memory from a watch of the bucket.
type View struct {
	kv  jetstream.KeyValue
	log zerolog.Logger

	mu       sync.RWMutex
	agents   map[string]protocol.Presence
	ready    chan struct{}
	onChange []func(Change)
}

// NewView binds a view to the presence bucket. Call Run to start watching.
func NewView(ctx context.Context, js jetstream.JetStream, log zerolog.Logger) (*View, error) {
	kv, err := js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		return nil, fmt.Errorf("open presence bucket %s: %w", protocol.BucketPresence, err)
	}
	return &View{kv: kv, log: log, agents: map[string]protocol.Presence{}, ready: make(chan struct{})}, nil
}

// OnChange registers f to be called (from the watch goroutine) on every
// change after the initial state. Register before Run.
func (v *View) OnChange(f func(Change)) { v.onChange = append(v.onChange, f) }

// Ready is closed once the initial state has been loaded.
func (v *View) Ready() <-chan struct{} { return v.ready }

// Run watches the bucket until ctx ends. A watch that breaks is restarted.
func (v *View) Run(ctx context.Context) error {
	w, err := v.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch presence: %w", err)
	}
	defer func() { _ = w.Stop() }()
	initial := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("presence watch closed")
			}
			if e == nil {
				if initial {
					initial = false
					close(v.ready)
				}
				continue
			}
			c := v.apply(e)
			if !initial {
				for _, f := range v.onChange {
					f(c)
				}
			}
		}
	}
}

func (v *View) apply(e jetstream.KeyValueEntry) Change {
	c := Change{Key: e.Key()}
	v.mu.Lock()
	defer v.mu.Unlock()
	switch e.Operation() {
	case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
		c.Gone = true
		c.Presence = v.agents[e.Key()]
		// A TTL expiry arrives as a purge marker; a clean shutdown deletes.
		c.Expired = e.Operation() == jetstream.KeyValuePurge
		delete(v.agents, e.Key())
	default:
		var p protocol.Presence
		if err := json.Unmarshal(e.Value(), &p); err != nil {
			v.log.Warn().Err(err).Str("key", e.Key()).Msg("ignoring undecodable presence entry")
			return c
		}
		v.agents[e.Key()] = p
		c.Presence = p
	}
	return c
}

// Agents returns the present agents sorted by pool then id.
func (v *View) Agents() []protocol.Presence {
	v.mu.RLock()
	out := make([]protocol.Presence, 0, len(v.agents))
	for _, p := range v.agents {
		out = append(out, p)
	}
	v.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Pool != out[j].Pool {
			return out[i].Pool < out[j].Pool
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Pool returns the present agents of one pool.
func (v *View) Pool(pool string) []protocol.Presence {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var out []protocol.Presence
	for _, p := range v.agents {
		if p.Pool == pool {
			out = append(out, p)
		}
	}
	return out
}

// List reads the present agents once, without a running view (for the CLI).
func List(ctx context.Context, js jetstream.JetStream) ([]protocol.Presence, error) {
	kv, err := js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		return nil, fmt.Errorf("open presence bucket: %w", err)
	}
	v := &View{kv: kv, log: zerolog.Nop(), agents: map[string]protocol.Presence{}, ready: make(chan struct{})}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- v.Run(ctx) }()
	select {
	case <-v.ready:
		cancel()
		<-done
		return v.Agents(), nil
	case err := <-done:
		return nil, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
