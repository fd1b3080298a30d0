package compensate_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/wardenhq/warden/internal/compensate"
)

func st(id string, status compensate.Status, comp bool, deps ...string) compensate.Step {
	return compensate.Step{ID: id, DependsOn: deps, Status: status, Compensable: comp}
}

func show(p []compensate.Compensation) string {
	s := ""
	for _, c := range p {
		s += fmt.Sprintf("%s%v ", c.Of, c.After)
	}
	return s
}

func TestPlan(t *testing.T) {
	t.Parallel()
	const (
		ok  = compensate.Succeeded
		no  = compensate.NotRun
		fly = compensate.InFlight
	)
	cases := []struct {
		name  string
		steps []compensate.Step
		want  string
	}{
		{"chain, last failed: reverse order",
			[]compensate.Step{st("a", ok, true), st("b", ok, true, "a"), st("c", no, true, "b")},
			"b[] a[b] "},
		{"middle step has no compensation: order still holds through it",
			[]compensate.Step{st("a", ok, true), st("b", ok, false, "a"), st("c", ok, true, "b"), st("d", no, true, "c")},
			"c[] a[c] "},
		{"diamond: the two branches in parallel, then the root",
			[]compensate.Step{st("root", ok, true), st("l", ok, true, "root"), st("r", ok, true, "root"), st("join", no, true, "l", "r")},
			"l[] r[] root[l r] "},
		{"independent steps: spec order, no waits",
			[]compensate.Step{st("x", ok, true), st("y", ok, true), st("z", no, true)},
			"x[] y[] "},
		{"nothing succeeded: nothing to undo",
			[]compensate.Step{st("a", no, true), st("b", no, true, "a")},
			""},
		{"a step that never succeeded is not undone, its upstream is",
			[]compensate.Step{st("a", ok, true), st("b", no, true, "a"), st("c", ok, true)},
			"a[] c[] "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p, err := compensate.Plan(c.steps)
			if err != nil {
				t.Fatal(err)
			}
			if got := show(p); got != c.want {
				t.Fatalf("plan %q, want %q", got, c.want)
			}
		})
	}
	if _, err := compensate.Plan([]compensate.Step{st("a", ok, true), st("b", fly, true)}); !errors.Is(err, compensate.ErrUnsettled) {
		t.Fatalf("in-flight step: %v, want ErrUnsettled", err)
	}
}

func TestOutcomeAndReady(t *testing.T) {
	t.Parallel()
	// root <- l, root <- r: l and r undo first, then root.
	plan, err := compensate.Plan([]compensate.Step{
		st("root", compensate.Succeeded, true),
		st("l", compensate.Succeeded, true, "root"),
		st("r", compensate.Succeeded, true, "root"),
	})
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]compensate.CompStatus{}
	if got := fmt.Sprint(compensate.Ready(plan, status)); got != "[l r]" {
		t.Fatalf("ready %s", got)
	}
	status["l"], status["r"] = compensate.Done, compensate.Running
	if s, _ := compensate.Outcome(plan, status); s != compensate.StateCompensating {
		t.Fatalf("state %s", s)
	}
	if got := fmt.Sprint(compensate.Ready(plan, status)); got != "[]" {
		t.Fatalf("root ready before r is undone: %s", got)
	}
	status["r"] = compensate.Done
	if got := fmt.Sprint(compensate.Ready(plan, status)); got != "[root]" {
		t.Fatalf("ready %s", got)
	}
	status["root"] = compensate.Done
	if s, skip := compensate.Outcome(plan, status); s != compensate.StateCompensated || len(skip) != 0 {
		t.Fatalf("state %s skip %v", s, skip)
	}

	// r's compensation fails for good: root's is skipped, l's still ran.
	status = map[string]compensate.CompStatus{"l": compensate.Done, "r": compensate.Failed}
	s, skip := compensate.Outcome(plan, status)
	if s != compensate.StateCompensationFailed || fmt.Sprint(skip) != "[root]" {
		t.Fatalf("state %s skip %v", s, skip)
	}
	// While l still runs the job is compensating, and root is already doomed.
	status = map[string]compensate.CompStatus{"l": compensate.Running, "r": compensate.Failed}
	if s, skip := compensate.Outcome(plan, status); s != compensate.StateCompensating || fmt.Sprint(skip) != "[root]" {
		t.Fatalf("state %s skip %v", s, skip)
	}
}
