package jobstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// Load of a job of more than 1,024 records reads through an ordered
// consumer (lastByConsumer), which it never deleted: each read left one on
// the jobs stream for nats.go's 5-minute inactive threshold. (Found by a
// reviewer.)
//
// Old code: "10 loads of a 1,100-step job left 10 consumers on the jobs
// stream".
func TestWideLoadLeavesNoConsumer(t *testing.T) {
	t.Parallel()
	st, js := newStore(t)
	ctx := testCtx(t)
	sp := spec.Job{Name: "big"}
	for i := range 1100 {
		sp.Steps = append(sp.Steps, spec.Step{ID: fmt.Sprintf("s%04d", i), Action: "echo"})
	}
	now := time.Now().UTC()
	if _, err := st.CreateJob(ctx, jobstore.NewJob("wide", sp, now)); err != nil {
		t.Fatal(err)
	}
	steps, _ := jobstore.NewSteps("wide", sp, jobstore.StepDefaults{Timeout: time.Minute}, now)
	b := st.Batch()
	for _, s := range steps {
		b.Add(st.StepWrite(s, 0))
	}
	for _, r := range b.Wait(ctx) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	for range 10 {
		if _, err := st.Load(ctx, "wide"); err != nil {
			t.Fatal(err)
		}
	}
	s, err := js.Stream(ctx, "KV_"+protocol.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Consumers; n != 0 {
		t.Fatalf("10 loads of a 1,100-step job left %d consumers on the jobs stream", n)
	}
}
