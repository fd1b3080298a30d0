package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/client"
)

func (a *app) jobCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "job", Short: "Inspect, follow, cancel or retry one job"}
	cmd.AddCommand(a.jobOpsCommands()...)
	cmd.AddCommand(&cobra.Command{
		Use:   "show ID",
		Short: "Show a job and its steps: state, attempt, agent, epoch, lease, error and attempts",
		Args:  exactArgs(1),
		RunE:  func(cmd *cobra.Command, args []string) error { return a.showJob(cmd.Context(), args[0]) },
	})
	cmd.AddCommand(a.followCommand())
	return cmd
}

func (a *app) showJob(ctx context.Context, id string) error {
	return a.withClient(ctx, func(ctx context.Context, c *client.Client) error {
		d, err := c.Job(ctx, id)
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(a.stdout, d)
		}
		printJob(a, d, time.Now())
		return nil
	})
}

func printJob(a *app, d client.JobDetail, now time.Time) {
	j := d.Job
	w := a.stdout
	fmt.Fprintf(w, "Job:      %s\n", j.ID)
	fmt.Fprintf(w, "Name:     %s\n", j.Name)
	switch d.Held {
	case client.HeldDelayed:
		fmt.Fprintf(w, "State:    %s (delayed: starts %s, in %s; held in WARDEN_DELAY, not made yet)\n",
			j.State, timestamp(d.StartsAt), max(d.StartsAt.Sub(now), 0).Round(time.Second))
	case client.HeldQueued:
		fmt.Fprintf(w, "State:    %s (queued: its submission waits for a scheduler, not made yet)\n", j.State)
	default:
		fmt.Fprintf(w, "State:    %s (desired %s)\n", j.State, j.Desired)
	}
	fmt.Fprintf(w, "Created:  %s (%s ago)\n", timestamp(j.CreatedAt), age(j.CreatedAt, now))
	if !j.FinishedAt.IsZero() {
		fmt.Fprintf(w, "Finished: %s (took %s)\n", timestamp(j.FinishedAt), j.FinishedAt.Sub(j.CreatedAt).Round(time.Millisecond))
	}
	switch {
	case j.TimedOut:
		fmt.Fprintf(w, "Timeout:  %s, ran out %s\n", j.Spec.Timeout, timestamp(j.Deadline))
	case j.TimeoutPending():
		fmt.Fprintf(w, "Timeout:  %s, runs out %s (in %s)\n", j.Spec.Timeout, timestamp(j.Deadline), max(j.Deadline.Sub(now), 0).Round(time.Second))
	}
	if j.Spec.IdempotencyKey != "" {
		fmt.Fprintf(w, "Key:      %s\n", j.Spec.IdempotencyKey)
	}
	if j.Error != "" {
		fmt.Fprintf(w, "Error:    %s\n", j.Error)
	}
	fmt.Fprintln(w)

	t := newTable(w, "STEP", "ACTION", "STATE", "ATTEMPT", "AGENT", "EPOCH", "LOCKED UNTIL", "DEPENDS ON", "ERROR / WAITING")
	for _, s := range d.Steps {
		note := s.LastError
		if s.State == jobstore.StepPending && s.Waiting != "" {
			note = "waiting: " + s.Waiting
		}
		t.row(s.ID, s.Action, string(s.State), fmt.Sprint(s.Attempt), stepAgent(s), fmt.Sprint(s.Epoch),
			until(s.LockedUntil, now), strings.Join(s.DependsOn, ","), oneLine(note, 60))
	}
	if len(d.Steps) < len(j.Spec.Steps) {
		t.row(fmt.Sprintf("(%d steps not materialised yet)", len(j.Spec.Steps)-len(d.Steps)))
	}
	_ = t.flush()

	var chains []string
	for _, s := range d.Steps {
		if len(s.Attempts) == 0 {
			continue
		}
		var parts []string
		for i, at := range s.Attempts {
			p := fmt.Sprintf("#%d epoch %d on %s: %s", i+1, at.Epoch, orDash(at.Agent), at.Status)
			if !at.FinishedAt.IsZero() && !at.StartedAt.IsZero() {
				p += fmt.Sprintf(" (%s)", at.FinishedAt.Sub(at.StartedAt).Round(time.Millisecond))
			}
			if at.Error != "" {
				p += fmt.Sprintf(" %q", oneLine(at.Error, 80))
				if at.Class != "" {
					p += " [" + at.Class + "]"
				}
			}
			parts = append(parts, p)
		}
		chains = append(chains, fmt.Sprintf("  %s: %s", s.ID, strings.Join(parts, " -> ")))
	}
	if len(chains) > 0 {
		fmt.Fprintln(w, "\nAttempts:")
		for _, c := range chains {
			fmt.Fprintln(w, c)
		}
	}
	printOutputs(w, d.Steps)
}

// printOutputs shows each succeeded step's output, compactly.
func printOutputs(w interface{ Write([]byte) (int, error) }, steps []*jobstore.Step) {
	first := true
	for _, s := range steps {
		if len(s.Output) == 0 || string(s.Output) == "null" {
			continue
		}
		if first {
			fmt.Fprintln(w, "\nOutputs:")
			first = false
		}
		fmt.Fprintf(w, "  %s: %s\n", s.ID, oneLine(string(s.Output), 300))
	}
}
