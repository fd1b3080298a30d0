package streams

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Roll-ups. A message carrying "Nats-Rollup: all" has the server purge
// every other message of its stream as it stores it, and NATS permissions
// cannot filter headers: whoever may write one key of a bucket that allows
// roll-ups may empty the bucket. nats.go makes every bucket allow them (its
// KeyValueConfig has no setting for it; KeyValue.Purge is a "Nats-Rollup:
// sub"), so a bucket definition says "allow_rollup_hdrs" itself, and a
// bucket that refuses them has its stream updated after nats.go applied
// the rest.
//
// The server keeps roll-ups on for a bucket with limit markers
// (limit_marker_ttl: it stores each marker as a roll-up of its key), and
// would silently turn a refusal back on; such a definition is refused
// here instead (errMarkersNeedRollups), and Ensure checks that the server
// kept what it asked for.

// bucketDef is a bucket definition: the nats.go configuration and whether
// its stream accepts roll-ups.
type bucketDef struct {
	jetstream.KeyValueConfig
	// AllowRollup is the stream's allow_rollup_hdrs. Every bucket file
	// states it: true (nats.go's default) or false.
	AllowRollup *bool `json:"allow_rollup_hdrs"`
}

// refusesRollups reports whether the bucket's stream must refuse roll-ups.
func (b bucketDef) refusesRollups() bool { return b.AllowRollup != nil && !*b.AllowRollup }

// decodeBucket reads a bucket definition and checks its roll-up setting.
func decodeBucket(name string) (bucketDef, error) {
	var b bucketDef
	if err := decode(name, &b); err != nil {
		return b, err
	}
	if err := b.validate(); err != nil {
		return b, fmt.Errorf("embedded %s: %w", name, err)
	}
	return b, nil
}

// validate checks the roll-up setting: stated, and not a refusal the
// server would ignore.
func (b bucketDef) validate() error {
	if b.AllowRollup == nil {
		return errors.New("allow_rollup_hdrs must be stated (false unless the bucket needs roll-ups or limit markers)")
	}
	if b.refusesRollups() && b.LimitMarkerTTL > 0 {
		return errMarkersNeedRollups
	}
	return nil
}

var errMarkersNeedRollups = errors.New("allow_rollup_hdrs false with limit_marker_ttl: the server stores limit markers as roll-ups and keeps roll-ups on")

// bucketHash is the definition hash Ensure records on a bucket's stream.
// A bucket that allows roll-ups hashes as its nats.go configuration alone,
// as before buckets said so, so that its recorded hash still matches.
func bucketHash(b bucketDef) string {
	if !b.refusesRollups() {
		return kvHash(b.KeyValueConfig)
	}
	b.Metadata = nil
	return hashOf(b)
}

// refuseRollups turns roll-ups off on the stream of bucket b, which
// nats.go has just created or updated with them on and without a
// definition hash, checks that the server kept the setting, and only then
// records the definition hash h: a stream the server would not change, or
// a setup that stops half-way, is applied again at the next start.
func refuseRollups(ctx context.Context, js jetstream.JetStream, b bucketDef, h string) error {
	name := "KV_" + b.Bucket
	// Another process setting up at the same moment (two schedulers
	// starting together) has nats.go update the bucket with roll-ups on
	// between our read and our update: the server then answers with them
	// on, which only limit markers explain once nobody else writes the
	// config. Read and update again a few times before saying so.
	for attempt := 0; ; attempt++ {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return setupError(name, fmt.Errorf("read bucket %s: %w", b.Bucket, err))
		}
		c := s.CachedInfo().Config
		c.AllowRollup = false
		unhashed := withHash(c.Metadata, "")
		delete(unhashed, MetadataConfigHash)
		kept := true
		for _, md := range []map[string]string{unhashed, withHash(c.Metadata, h)} {
			c.Metadata = md
			s, err = js.UpdateStream(ctx, c)
			if err != nil {
				if isAPIError(err) {
					return &IncompatibleError{Name: name, Err: err}
				}
				return setupError(name, fmt.Errorf("refuse roll-ups on bucket %s: %w", b.Bucket, err))
			}
			if s.CachedInfo().Config.AllowRollup {
				kept = false
				break
			}
		}
		switch {
		case kept:
			return nil
		case s.CachedInfo().Config.SubjectDeleteMarkerTTL > 0 || attempt == 4:
			return &IncompatibleError{Name: name, Err: errMarkersNeedRollups}
		}
		select {
		case <-ctx.Done():
			return setupError(name, ctx.Err())
		case <-time.After(time.Duration(50+rand.IntN(100)) * time.Millisecond):
		}
	}
}
