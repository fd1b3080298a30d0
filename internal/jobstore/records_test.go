package jobstore

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/wardenhq/warden/pkg/spec"
)

// A job's encoding, its spec encoded once, decodes to the same job as
// before, and a spec changed (compensation appends steps) is encoded
// afresh.
func TestJobEncodingCachesItsSpec(t *testing.T) {
	now := time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC)
	j := NewJob("job-1", spec.Job{Name: "n", Steps: []spec.Step{{ID: "a", Action: "echo"}}}, now)
	j.State = JobRunning
	roundTrip := func() *Job {
		t.Helper()
		b, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		var out Job
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return &out
	}
	for range 2 { // encoded, then from the cache
		if got := roundTrip(); !reflect.DeepEqual(got.Spec, j.Spec) || got.State != JobRunning || got.ID != "job-1" {
			t.Fatalf("decoded %+v, want %+v", got, j)
		}
	}
	j.State = JobSucceeded // fields beside the spec are encoded every time
	if got := roundTrip(); got.State != JobSucceeded {
		t.Fatalf("state %s after a change, want succeeded", got.State)
	}
	j.Spec.Steps = append(j.Spec.Steps, spec.Step{ID: "undo-a", Action: "echo"})
	j.SpecChanged()
	if got := roundTrip(); len(got.Spec.Steps) != 2 || got.Spec.Steps[1].ID != "undo-a" {
		t.Fatalf("spec after SpecChanged: %+v", got.Spec.Steps)
	}
}
