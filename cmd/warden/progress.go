package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/client"
)

// progress prints a followed job's transitions, one line each: a step's
// state, attempt, agent and epoch (and error), and the job's own state.
// Updates that change nothing a person follows (a lease extension) print
// nothing.
type progress struct {
	w     io.Writer
	start time.Time
	job   jobstore.JobState
	steps map[string]string
	width int
}

func newProgress(w io.Writer) *progress {
	return &progress{w: w, start: time.Now(), steps: map[string]string{}}
}

func (p *progress) update(u client.Update) {
	if u.Initial {
		p.width = stepWidth(u)
		if u.Job == nil {
			fmt.Fprintln(p.w, "waiting for a scheduler to take the job...")
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
	key := fmt.Sprintf("%s/%d/%d/%s", s.State, s.Epoch, s.Attempt, s.Waiting)
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
