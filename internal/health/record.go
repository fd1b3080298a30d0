package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/watch"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Record is what the supervisor leader stores under <pool>.<agent> in the
// warden_health bucket: the assessment and what self-healing did about it.
type Record struct {
	Agent string `json:"agent"`
	Pool  string `json:"pool"`
	Assessment
	// Action is the self-healing action in force: "", deprioritise,
	// reduce_load, drain or failover. Its orders were obeyed (a failover
	// is in force once ordered: a failed agent may not answer its drain,
	// and its queue is moved regardless).
	Action string `json:"action,omitempty"`
	// Held are the orders self-healing gave the agent that may still be in
	// force: HeldDrain, HeldLimit (Limit tasks at once). An order is held
	// from just before it is sent until the agent confirms it undone, so
	// an order whose answer was lost counts: the agent keeps a drain or a
	// limit until it is told otherwise, and the leader (this one or the
	// next, which takes them over from here) releases it once it is well.
	Held  []string `json:"held,omitempty"`
	Limit int      `json:"limit,omitempty"`
}

// Orders self-healing holds an agent with (Record.Held).
const (
	HeldDrain = "drain"
	HeldLimit = "limit"
)

// Key is the record's key.
func (r Record) Key() string { return protocol.PresenceKey(r.Pool, r.Agent) }

// WatchRecords calls put for every record stored and gone for every key
// removed, until ctx ends. Schedulers use it to feed selection. Gaps in the
// watch (server restart, reconnect) are re-synced by internal/watch: a
// record removed meanwhile is reported gone, one changed is reported again.
func WatchRecords(ctx context.Context, js jetstream.JetStream, put func(Record), gone func(key string)) error {
	w, err := watch.New(ctx, js, protocol.BucketHealth, watch.Config{})
	if err != nil {
		return fmt.Errorf("health records: %w", err)
	}
	return w.Run(ctx, func(e watch.Event) {
		if e.Gone() {
			gone(e.Key)
			return
		}
		var r Record
		if json.Unmarshal(e.Entry.Value(), &r) == nil {
			put(r)
		}
	})
}

// ListRecords reads every stored record once (for the CLI).
func ListRecords(ctx context.Context, js jetstream.JetStream) (map[string]Record, error) {
	kv, err := js.KeyValue(ctx, protocol.BucketHealth)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", protocol.BucketHealth, err)
	}
	out, err := Records(ctx, kv)
	if err != nil {
		return map[string]Record{}, nil // the CLI shows what it can: none
	}
	return out, nil
}

// Records reads every record stored in kv (the health bucket), by key. A
// record that ages out while it is read is left out; any other failure is
// returned (the supervisor rebuilds its healing orders from these, and
// must not take a read it could not finish for "none held").
func Records(ctx context.Context, kv jetstream.KeyValue) (map[string]Record, error) {
	out := map[string]Record{}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return out, nil
		}
		return nil, fmt.Errorf("list %s: %w", protocol.BucketHealth, err)
	}
	defer func() { _ = lister.Stop() }()
	for key := range lister.Keys() {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // aged out meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("read %s %s: %w", protocol.BucketHealth, key, err)
		}
		var r Record
		if json.Unmarshal(e.Value(), &r) == nil {
			out[key] = r
		}
	}
	return out, nil
}
