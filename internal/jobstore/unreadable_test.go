package jobstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// One record that does not decode (written by hand, or by another
// version) is listed as unreadable; the others are listed as ever. It
// failed the whole listing: `jobs ls`, the dashboard, and the overview
// when it was the newest job's. (Found by a reviewer.)
//
// Old code: "one bad step record of one job failed the listing of 3:
// decode step.bad.a: unexpected end of JSON input".
func TestOneUnreadableRecordFailsNoListing(t *testing.T) {
	t.Parallel()
	st, js := newStore(t)
	ctx := testCtx(t)
	sp := spec.Job{Name: "x", Steps: []spec.Step{{ID: "a", Action: "echo"}, {ID: "b", Action: "echo"}}}
	for _, id := range []string{"good-1", "bad", "good-2"} {
		if _, err := st.CreateJob(ctx, jobstore.NewJob(id, sp, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	m := nats.NewMsg("$KV." + protocol.BucketJobs + "." + protocol.StepKey("bad", "a"))
	m.Data = []byte(`{"state": 7`)
	natstest.PublishAll(t, js, m)
	p, err := st.List(ctx, js, jobstore.ListFilter{})
	if err != nil {
		t.Fatalf("one bad step record of one job failed the listing of 3: %v", err)
	}
	if len(p.Jobs) != 3 {
		t.Fatalf("%d jobs listed, want 3", len(p.Jobs))
	}
	for _, lj := range p.Jobs {
		bad := lj.ID == "bad"
		if bad != (lj.Unreadable != nil) || bad != (lj.Job == nil) {
			t.Errorf("%s: job %v, unreadable %v", lj.ID, lj.Job != nil, lj.Unreadable)
		}
	}
	if _, err := st.Load(ctx, "bad"); !errors.Is(err, jobstore.ErrUndecodable) {
		t.Errorf("Load of the bad job: %v, want ErrUndecodable", err)
	}
}

// A job record written without the listing headers (an older version)
// that does not decode failed every scan, so the index never built and
// every listing failed. It is left out now.
//
// Old code: "one undecodable legacy record failed the listing: decode
// job.legacy-bad: invalid character 'o' in literal null".
func TestOneUndecodableLegacyRecordFailsNoScan(t *testing.T) {
	t.Parallel()
	st, js := newStore(t)
	ctx := testCtx(t)
	sp := spec.Job{Name: "x", Steps: []spec.Step{{ID: "a", Action: "echo"}}}
	if _, err := st.CreateJob(ctx, jobstore.NewJob("good", sp, time.Now())); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("$KV." + protocol.BucketJobs + "." + protocol.JobKey("legacy-bad"))
	m.Data = []byte(`not json`)
	natstest.PublishAll(t, js, m)
	p, err := st.List(ctx, js, jobstore.ListFilter{})
	if err != nil {
		t.Fatalf("one undecodable legacy record failed the listing: %v", err)
	}
	if len(p.Jobs) != 1 || p.Jobs[0].ID != "good" {
		t.Fatalf("listed %d jobs, want good alone", len(p.Jobs))
	}
}
