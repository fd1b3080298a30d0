package streams

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
)

// MismatchError says a process is configured with a setting that differs
// from the deployment record: it must not start, since it would put tasks or
// submissions where the others do not look (or rewrite their streams).
type MismatchError struct {
	// Setting is the YAML name of the setting, e.g. "task_shards".
	Setting string
	// Configured is this process's value; Recorded the deployment's.
	Configured, Recorded int
	// RecordedBy and RecordedAt say who wrote the record and when.
	RecordedBy string
	RecordedAt time.Time
}

func (e *MismatchError) Error() string {
	by := e.RecordedBy
	if by == "" {
		by = "an unnamed process"
	}
	return fmt.Sprintf("%s mismatch: this process is configured with %s=%d but the deployment record "+
		"(KV %s key %s, written by %s at %s) says %s=%d; give every scheduler, supervisor and agent the same %s, "+
		"or, to change it on purpose, stop every process and `nats kv del %s %s`",
		e.Setting, e.Setting, e.Configured, protocol.BucketDeployment, protocol.KeyDeployment,
		by, e.RecordedAt.UTC().Format(time.RFC3339), e.Setting, e.Recorded, e.Setting,
		protocol.BucketDeployment, protocol.KeyDeployment)
}

// Deployment returns the deployment settings these options apply (defaults
// filled in): what Ensure records and compares.
func (o Options) Deployment() protocol.Deployment {
	o = o.withDefaults()
	return protocol.Deployment{TaskShards: o.TaskShards, Partitions: o.Partitions}
}

// CheckDeployment compares want with the deployment record, creating the
// bucket and the record when absent and adding the settings the record lacks
// (a zero setting in want is not this process's to say). It returns a
// *MismatchError naming both values when a setting differs. Ensure calls it
// before it applies any stream.
func CheckDeployment(ctx context.Context, js jetstream.JetStream, want protocol.Deployment, replicas int) error {
	kv, err := deploymentBucket(ctx, js, replicas)
	if err != nil {
		return err
	}
	// A few rounds: another process may create or extend the record between
	// our read and our write; a lost CAS means read again.
	for range 5 {
		entry, err := kv.Get(ctx, protocol.KeyDeployment)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			_, err = kv.Create(ctx, protocol.KeyDeployment, encodeDeployment(js, want))
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue
			}
			if err != nil {
				return fmt.Errorf("write the deployment record: %w", err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("read the deployment record: %w", err)
		}
		rec, err := decodeDeployment(entry.Value())
		if err != nil {
			return err
		}
		merged, changed, err := compareDeployment(rec, want)
		if err != nil || !changed {
			return err
		}
		_, err = kv.Update(ctx, protocol.KeyDeployment, encodeDeployment(js, merged), entry.Revision())
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return fmt.Errorf("extend the deployment record: %w", err)
		}
		return nil
	}
	return fmt.Errorf("deployment record: still changing after 5 attempts")
}

// VerifyDeployment compares want with the deployment record without writing
// anything, for processes that only read the streams (agents). It returns
// nil when there is no record yet, and a *MismatchError when a setting
// differs.
func VerifyDeployment(ctx context.Context, js jetstream.JetStream, want protocol.Deployment) error {
	kv, err := js.KeyValue(ctx, protocol.BucketDeployment)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deployment bucket: %w", err)
	}
	entry, err := kv.Get(ctx, protocol.KeyDeployment)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the deployment record: %w", err)
	}
	rec, err := decodeDeployment(entry.Value())
	if err != nil {
		return err
	}
	_, _, err = compareDeployment(rec, want)
	return err
}

// compareDeployment returns rec extended with the settings it lacks from
// want, whether that changed it, or the first mismatch.
func compareDeployment(rec, want protocol.Deployment) (protocol.Deployment, bool, error) {
	merged, changed := rec, false
	for _, s := range []struct {
		name       string
		mine, have int
		set        func(int)
	}{
		{"task_shards", want.TaskShards, rec.TaskShards, func(v int) { merged.TaskShards = v }},
		{"partitions", want.Partitions, rec.Partitions, func(v int) { merged.Partitions = v }},
	} {
		switch {
		case s.mine == 0 || s.mine == s.have:
		case s.have == 0:
			s.set(s.mine)
			changed = true
		default:
			return rec, false, &MismatchError{Setting: s.name, Configured: s.mine, Recorded: s.have,
				RecordedBy: rec.WrittenBy, RecordedAt: rec.WrittenAt}
		}
	}
	return merged, changed, nil
}

func deploymentBucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, protocol.BucketDeployment)
	if err == nil || !errors.Is(err, jetstream.ErrBucketNotFound) {
		return kv, err
	}
	// Made as Ensure makes every bucket (ensureKV: roll-ups refused, the
	// definition's hash recorded), not first as nats.go would make it and
	// then again by Ensure a moment later.
	b, err := decodeBucket("kv_deployment.json")
	if err != nil {
		return nil, err
	}
	if replicas > 0 {
		b.Replicas = replicas
	}
	if err := ensureKV(ctx, js, b); err != nil {
		return nil, err
	}
	return js.KeyValue(ctx, protocol.BucketDeployment)
}

func encodeDeployment(js jetstream.JetStream, d protocol.Deployment) []byte {
	host, _ := os.Hostname()
	name := js.Conn().Opts.Name
	if name == "" {
		name = "an unnamed connection"
	}
	d.WrittenBy = fmt.Sprintf("%s on %s (pid %d)", name, host, os.Getpid())
	d.WrittenAt = time.Now().UTC()
	b, _ := json.Marshal(d) // a struct of ints, strings and a time: cannot fail
	return b
}

func decodeDeployment(b []byte) (protocol.Deployment, error) {
	var d protocol.Deployment
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("deployment record (KV %s key %s) is not valid JSON: %w",
			protocol.BucketDeployment, protocol.KeyDeployment, err)
	}
	return d, nil
}
