package jobstore_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

func benchSteps(b *testing.B, n int, chain bool) []*jobstore.Step {
	b.Helper()
	var sp spec.Job
	for i := 0; i < n; i++ {
		st := spec.Step{ID: fmt.Sprintf("s%d", i), Action: "echo", Params: map[string]any{"message": "hi"}}
		if chain && i > 0 {
			st.DependsOn = []string{fmt.Sprintf("s%d", i-1)}
		}
		sp.Steps = append(sp.Steps, st)
	}
	steps, err := jobstore.NewSteps("job-1", sp, jobstore.StepDefaults{Timeout: time.Minute, MaxRetries: 3}, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	return steps
}

// BenchmarkStepTransitions is a step's dispatch and its result, the two
// state transitions every step goes through.
func BenchmarkStepTransitions(b *testing.B) {
	now := time.Now()
	b.Run("dispatch_and_result", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			st := &jobstore.Step{JobID: "job-1", ID: "s", State: jobstore.StepPending, Desired: jobstore.StepSucceeded, Timeout: protocol.Duration(time.Minute)}
			if err := st.Dispatch("agent-1", "", now, 30*time.Second); err != nil {
				b.Fatal(err)
			}
			r := protocol.Result{JobID: "job-1", StepID: "s", Epoch: st.Epoch, Agent: "agent-1", Status: protocol.ResultSucceeded, FinishedAt: now}
			if _, err := st.ApplyResult(r, false, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("stale_result", func(b *testing.B) {
		st := &jobstore.Step{JobID: "job-1", ID: "s", State: jobstore.StepPending, Timeout: protocol.Duration(time.Minute)}
		_ = st.Dispatch("agent-1", "", now, 30*time.Second)
		r := protocol.Result{JobID: "job-1", StepID: "s", Epoch: 99, Agent: "agent-1", Status: protocol.ResultSucceeded}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := st.ApplyResult(r, false, now); err == nil {
				b.Fatal("stale result applied")
			}
		}
	})
}

// BenchmarkEvaluate is the plan the dispatcher derives from a job's steps
// on every advance.
func BenchmarkEvaluate(b *testing.B) {
	for _, c := range []struct {
		name  string
		n     int
		chain bool
	}{{"parallel_10", 10, false}, {"parallel_100", 100, false}, {"chain_10", 10, true}, {"chain_100", 100, true}} {
		steps := benchSteps(b, c.n, c.chain)
		// Half done: the first half succeeded.
		for _, st := range steps[:c.n/2] {
			st.State = jobstore.StepSucceeded
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = jobstore.Evaluate(steps)
			}
		})
	}
}

// BenchmarkStepCodec is the JSON encoding of a step record, done on every
// job store read and write.
func BenchmarkStepCodec(b *testing.B) {
	st := benchSteps(b, 1, false)[0]
	now := time.Now()
	_ = st.Dispatch("agent-1", "", now, 30*time.Second)
	data, err := json.Marshal(st)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("marshal", benchMarshal(st, len(data)))
	b.Run("unmarshal", benchUnmarshal[jobstore.Step](data))
}

// benchMarshal is encoding/json's encoding of v, size bytes.
func benchMarshal(v any, size int) func(*testing.B) {
	return func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(size))
		for b.Loop() {
			if _, err := json.Marshal(v); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// benchUnmarshal is encoding/json's decoding of data into a T.
func benchUnmarshal[T any](data []byte) func(*testing.B) {
	return func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			var out T
			if err := json.Unmarshal(data, &out); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkJobRecordCodec is the JSON encoding of a single-step job's
// inline record as the scheduler writes it after the dispatch: the write
// every single-step job makes most often.
func BenchmarkJobRecordCodec(b *testing.B) {
	now := time.Now()
	sp := spec.Job{Name: "bench", Steps: []spec.Step{{ID: "s", Action: "noop", Params: map[string]any{"message": "hi"}}}}
	j := jobstore.NewJob("job-1", sp, now)
	steps, err := jobstore.NewSteps(j.ID, sp, jobstore.StepDefaults{Timeout: time.Minute, MaxRetries: 3}, now)
	if err != nil {
		b.Fatal(err)
	}
	if err := steps[0].Dispatch("agent-1", "token", now, 30*time.Second); err != nil {
		b.Fatal(err)
	}
	j.Inline, j.Steps, j.State = true, steps, jobstore.JobRunning
	data, err := json.Marshal(j)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encoding_json", benchMarshal(j, len(data)))
	// The record write as the scheduler makes it: headers and Warden's
	// own encoder (encode.go).
	var store jobstore.Store
	b.Run("job_write", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if w := store.JobWrite(j, 3); len(w.Msg.Data) != len(data) {
				b.Fatalf("encoded %d bytes, encoding/json %d", len(w.Msg.Data), len(data))
			}
		}
	})
	b.Run("unmarshal", benchUnmarshal[jobstore.Job](data))
}
