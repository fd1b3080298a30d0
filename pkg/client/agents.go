package client

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Agents lists the agents present now, sorted by pool then id.
func (c *Client) Agents(ctx context.Context) ([]protocol.Presence, error) {
	agents, err := presence.List(ctx, c.js)
	if err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	return agents, nil
}

// WaitForAgents returns once at least n agents of pool are present (any
// pool when pool is empty), watching the presence bucket rather than
// polling it. Bound the wait with ctx.
func (c *Client) WaitForAgents(ctx context.Context, pool string, n int) error {
	kv, err := c.js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		return fmt.Errorf("open presence bucket: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch presence: %w", err)
	}
	defer func() { _ = w.Stop() }()
	present := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d agents (have %d): %w", n, len(present), ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("waiting for agents: %w", ErrWatchClosed)
			}
			if e != nil {
				switch e.Operation() {
				case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
					delete(present, e.Key())
				default:
					var p protocol.Presence
					if json.Unmarshal(e.Value(), &p) == nil && (pool == "" || p.Pool == pool) {
						present[e.Key()] = true
					}
				}
			}
			if len(present) >= n {
				return nil
			}
		}
	}
}
