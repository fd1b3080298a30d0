package scheduler

import "testing"

// Results (and advances, and retries) are taken before submissions and
// wakes that came earlier; each lane keeps its order.
func TestQueueTakesResultsFirst(t *testing.T) {
	q := newQueue()
	q.push(input{kind: inSubmit, job: "s1"}, input{kind: inWake}, input{kind: inSubmit, job: "s2"})
	q.push(input{kind: inResult, job: "r1"}, input{kind: inAdvance, job: "a1"}, input{kind: inResult, job: "r2"})
	q.pushFront(input{kind: inSubmit, job: "retry", tries: 1})
	want := []string{"retry", "r1", "a1", "r2", "s1", "", "s2"}
	var got []string
	for _, in := range q.take(4) {
		got = append(got, in.job)
	}
	for _, in := range q.take(10) {
		got = append(got, in.job)
	}
	if len(got) != len(want) {
		t.Fatalf("took %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("took %q, want %q", got, want)
		}
	}
	if rest := q.take(10); rest != nil {
		t.Fatalf("queue not empty: %v", rest)
	}
}
