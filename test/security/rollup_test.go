package security

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/creds"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// errCodeRollupFailed is the server's JSStreamRollupFailedF ("rollup not
// permitted" on a stream that refuses roll-ups).
const errCodeRollupFailed = 10111

// TestRollupsRefusedOnBucketsWithoutMarkers: a process that may write a
// key of the deployment or rate-limit bucket (schedulers, supervisors)
// cannot have the server purge the bucket with "Nats-Rollup: all" (or a
// key's history with "sub"): NATS permissions cannot filter headers, so
// the buckets refuse roll-ups. The buckets with limit markers cannot
// (docs/security.md, "Roll-ups").
func TestRollupsRefusedOnBucketsWithoutMarkers(t *testing.T) {
	d := start(t)
	d.setupStreams(t)
	d.setupWorkflow(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, role := range []string{creds.RoleScheduler, creds.RoleSupervisor} {
		c := d.connect(t, role)
		rl, err := c.js.KeyValue(ctx, streams.BucketRateLimits)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rl.Put(ctx, "limit."+role, []byte("tat")); err != nil {
			t.Fatalf("%s: put a rate-limit record: %v", role, err)
		}
		for _, subj := range []string{"$KV." + streams.BucketRateLimits + ".limit.x", "$KV." + protocol.BucketDeployment + "." + protocol.KeyDeployment} {
			for _, rollup := range []string{"all", "sub"} {
				m := nats.NewMsg(subj)
				m.Data = []byte(`{}`)
				m.Header.Set(jetstream.MsgRollup, rollup)
				_, err := c.js.PublishMsg(ctx, m)
				var apiErr *jetstream.APIError
				if !errors.As(err, &apiErr) || apiErr.ErrorCode != errCodeRollupFailed {
					t.Fatalf("%s: a write on %s with Nats-Rollup: %s: %v, want the server's refusal", role, subj, rollup, err)
				}
			}
		}
		if e, err := rl.Get(ctx, "limit."+role); err != nil || string(e.Value()) != "tat" {
			t.Fatalf("%s: its rate-limit record after the refused roll-ups: %v", role, err)
		}
		if _, err := rl.Get(ctx, "limit.x"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("%s: the refused roll-up's own record: %v, want none", role, err)
		}
		dep, err := c.js.KeyValue(ctx, protocol.BucketDeployment)
		if err != nil {
			t.Fatal(err)
		}
		var rec protocol.Deployment
		if e, err := dep.Get(ctx, protocol.KeyDeployment); err != nil || json.Unmarshal(e.Value(), &rec) != nil || rec.TaskShards != shards {
			t.Fatalf("%s: the deployment record after the refused roll-ups: %v %+v", role, err, rec)
		}
		if got := c.refusals(); len(got) != 0 {
			t.Fatalf("%s: permission refusals %v: the roll-ups must reach the server to be refused there", role, got)
		}
	}
}

// setupWorkflow creates the schedules stream and the concurrency and
// rate-limit buckets as the setup identity.
func (d *deployment) setupWorkflow(t *testing.T) {
	t.Helper()
	c := d.connect(t, creds.RoleSetup)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := streams.EnsureWorkflow(ctx, c.js, streams.Options{TaskShards: shards}); err != nil {
		t.Fatalf("setup: %v", err)
	}
}
