package health

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Record is what the supervisor leader stores under <pool>.<agent> in the
// warden_health bucket: the assessment and what self-healing did about it.
type Record struct {
	Agent string `json:"agent"`
	Pool  string `json:"pool"`
	Assessment
	// Action is the self-healing action in force: "", deprioritise,
	// reduce_load, drain or failover.
	Action string `json:"action,omitempty"`
}

// Key is the record's key.
func (r Record) Key() string { return protocol.PresenceKey(r.Pool, r.Agent) }

// WatchRecords calls put for every record stored and gone for every key
// removed, until ctx ends. Schedulers use it to feed selection.
func WatchRecords(ctx context.Context, js jetstream.JetStream, put func(Record), gone func(key string)) error {
	kv, err := js.KeyValue(ctx, protocol.BucketHealth)
	if err != nil {
		return fmt.Errorf("open %s: %w", protocol.BucketHealth, err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", protocol.BucketHealth, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("%s watch closed", protocol.BucketHealth)
			}
			if e == nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				gone(e.Key())
				continue
			}
			var r Record
			if json.Unmarshal(e.Value(), &r) == nil {
				put(r)
			}
		}
	}
}

// ListRecords reads every stored record once (for the CLI).
func ListRecords(ctx context.Context, js jetstream.JetStream) (map[string]Record, error) {
	kv, err := js.KeyValue(ctx, protocol.BucketHealth)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", protocol.BucketHealth, err)
	}
	out := map[string]Record{}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return out, nil
	}
	for k := range lister.Keys() {
		if e, err := kv.Get(ctx, k); err == nil {
			var r Record
			if json.Unmarshal(e.Value(), &r) == nil {
				out[k] = r
			}
		}
	}
	return out, nil
}
