package main

import (
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/client"
)

// progress prints a followed job's transitions, one line each: a step's
// state, attempt, agent and epoch (and error), and the job's own state.
// Updates that change nothing a person follows (a lease extension) print
// nothing, and so does a step's waiting reason that changed only in an
// age it names ("gone 3s ago").
type progress struct {
	w     io.Writer
	start time.Time
	job   jobstore.JobState
	steps map[string]string
	width int
	// startsAt, for a submission that starts later (run_at, delay), is
	// when it is due: until then no scheduler makes the job.
	startsAt time.Time
}

func newProgress(w io.Writer) *progress {
	return &progress{w: w, start: time.Now(), steps: map[string]string{}}
}

func (p *progress) update(u client.Update) {
	if u.Initial {
		p.width = stepWidth(u)
		if u.Job == nil {
			if now := time.Now(); p.startsAt.After(now) {
				fmt.Fprintf(p.w, "job is delayed: starts %s, in %s; waiting for it to start...\n",
					timestamp(p.startsAt), p.startsAt.Sub(now).Round(time.Second))
			} else {
				fmt.Fprintln(p.w, "waiting for a scheduler to take the job...")
			}
		}
		for _, s := range u.Steps {
			p.step(s)
		}
	} else if u.Step != nil {
		if p.width == 0 {
			p.width = stepWidth(u)
		}
		p.step(u.Step)
	}
	if u.Job != nil && u.Job.State != p.job {
		p.job = u.Job.State
		p.jobLine(u.Job)
	}
}

func stepWidth(u client.Update) int {
	w := 8
	if u.Job != nil {
		for _, s := range u.Job.Spec.Steps {
			w = max(w, len(s.ID))
		}
	}
	return w
}

func (p *progress) step(s *jobstore.Step) {
	key := fmt.Sprintf("%s/%d/%d/%s", s.State, s.Epoch, s.Attempt, waitingReason(s.Waiting))
	if p.steps[s.ID] == key {
		return
	}
	p.steps[s.ID] = key
	var b strings.Builder
	fmt.Fprintf(&b, "%s  step %-*s  %-11s", p.elapsed(), p.width, s.ID, s.State)
	if s.Attempt > 0 {
		fmt.Fprintf(&b, "  attempt %d  agent %s  epoch %d", s.Attempt, orDash(stepAgent(s)), s.Epoch)
	}
	if s.State != jobstore.StepSucceeded && s.LastError != "" {
		fmt.Fprintf(&b, "  error: %s", oneLine(s.LastError, 200))
	}
	if s.State == jobstore.StepPending && s.Waiting != "" {
		fmt.Fprintf(&b, "  waiting: %s", oneLine(s.Waiting, 200))
	}
	fmt.Fprintln(p.w, strings.TrimRight(b.String(), " "))
}

// ageRE matches an age in a waiting reason: a duration and "ago".
var ageRE = regexp.MustCompile(`\b\d[0-9.]*(ns|µs|us|ms|s|m|h)([0-9.]+(ns|µs|us|ms|s|m|h))* ago\b`)

// waitingReason is a step's waiting reason without the ages it names, which
// change at every rewrite of the same reason.
func waitingReason(w string) string {
	return ageRE.ReplaceAllString(w, "ago")
}

func (p *progress) jobLine(j *jobstore.Job) {
	line := fmt.Sprintf("%s  job  %s %s", p.elapsed(), j.ID, j.State)
	if j.State.Terminal() && !j.FinishedAt.IsZero() {
		line += fmt.Sprintf(" in %s", j.FinishedAt.Sub(j.CreatedAt).Round(time.Millisecond))
	}
	if j.Error != "" {
		line += ": " + oneLine(j.Error, 300)
	}
	fmt.Fprintln(p.w, line)
}

// state is the followed job's state as last seen, for a follow cut short.
func (p *progress) state() string {
	switch {
	case p.job != "":
		return string(p.job)
	case p.startsAt.After(time.Now()):
		return fmt.Sprintf("pending (delayed: starts %s)", timestamp(p.startsAt))
	default:
		return "pending (no scheduler has taken it yet)"
	}
}

func (p *progress) elapsed() string {
	return fmt.Sprintf("%6.1fs", time.Since(p.start).Seconds())
}

// stepAgent is the agent a step ran on last: the actor while it holds the
// step, else the last attempt's agent.
func stepAgent(s *jobstore.Step) string {
	if s.Actor != "" {
		return s.Actor
	}
	if n := len(s.Attempts); n > 0 {
		return s.Attempts[n-1].Agent
	}
	return ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
