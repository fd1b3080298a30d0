package jobstore

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/spec"
)

// rewriteAfterInfo is a JetStream whose Stream call, once armed, runs
// hook after the real stream info was read: a write landing between a
// listing's "last sequence" and its next_by_subj look-up.
type rewriteAfterInfo struct {
	jetstream.JetStream
	hook func()
}

func (r *rewriteAfterInfo) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	st, err := r.JetStream.Stream(ctx, name)
	if h := r.hook; h != nil && err == nil {
		r.hook = nil
		h()
	}
	return st, err
}

// A job created before the listing began, rewritten (history 1: its
// create removed) just after the listing read the stream's last sequence,
// while the follower had not yet applied the create: await's next_by_subj
// found the rewrite past last and declared the index current, and the
// job was missing from a page answered by the index. (Found by a
// reviewer.)
//
// Old code: "answered from the index without the job created before the
// listing: [old] (matched 1)".
func TestIndexCatchUpWaitsForAJobRewrittenDuringTheListing(t *testing.T) {
	t.Parallel()
	ctx, s, js := openStore(t, 30*time.Second)
	sp := spec.Job{Name: "x", Steps: []spec.Step{{ID: "a", Action: "echo"}}}
	if _, err := s.CreateJob(ctx, NewJob("old", sp, time.Now().Add(-time.Minute))); err != nil {
		t.Fatal(err)
	}
	entries, last, err := s.scanJobs(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	wrap := &rewriteAfterInfo{JetStream: js}
	ix := &Index{store: s, js: wrap, cfg: IndexConfig{CatchUp: 5 * time.Second}.WithDefaults()}
	ix.install(entries, last) // the follower has applied everything up to here, and no more
	x := NewJob("new", sp, time.Now())
	rev, err := s.CreateJob(ctx, x) // stored before the listing begins
	if err != nil {
		t.Fatal(err)
	}
	wrap.hook = func() {
		x.State = JobRunning
		if _, err := s.UpdateJob(ctx, x, rev); err != nil {
			t.Fatal(err)
		}
		// The follower, late: it applies the job writes after last (the
		// create is gone, history 1: the rewrite) once the listing looks.
		go follow(ctx, t, js, s, ix, last)
	}
	var page ListPage
	var sel []JobEntry
	indexed := ix.page(ctx, ListFilter{}, 50, nil, &page, &sel)
	got := []string{}
	for _, e := range sel {
		got = append(got, e.ID)
	}
	if !indexed || !slices.Contains(got, "new") {
		t.Fatalf("answered from the index (%v) without the job created before the listing: %v (matched %d)", indexed, got, page.Matched)
	}
}

// follow applies to ix the job key writes after last, as its follower
// would, until ctx ends.
func follow(ctx context.Context, t *testing.T, js jetstream.JetStream, s *Store, ix *Index, last uint64) {
	time.Sleep(100 * time.Millisecond) // behind: the listing waits for it
	cons, err := js.OrderedConsumer(ctx, s.stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{jobKeysFilter}, DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq: last + 1, HeadersOnly: true,
	})
	if err != nil {
		t.Error(err)
		return
	}
	it, err := cons.Messages()
	if err != nil {
		t.Error(err)
		return
	}
	context.AfterFunc(ctx, it.Stop)
	for {
		m, err := it.Next()
		if err != nil {
			return
		}
		if err := ix.apply(ctx, m); err != nil {
			t.Error(err)
			return
		}
	}
}
