package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/jobstore"
)

var jobStates = []jobstore.JobState{jobstore.JobPending, jobstore.JobRunning, jobstore.JobSucceeded, jobstore.JobFailed, jobstore.JobCancelled}

func (a *app) jobsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "jobs", Short: "List jobs"}
	var state string
	ls := &cobra.Command{
		Use:     "ls [--state STATE]",
		Aliases: []string{"list"},
		Short:   "List jobs, newest first",
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := client.JobFilter{State: jobstore.JobState(state)}
			if state != "" && !validJobState(f.State) {
				return usageError("--state %q: want one of %v", state, jobStates)
			}
			return a.listJobs(cmd.Context(), f)
		},
	}
	ls.Flags().StringVar(&state, "state", "", fmt.Sprintf("only jobs in this state %v", jobStates))
	cmd.AddCommand(ls)
	return cmd
}

func validJobState(s jobstore.JobState) bool {
	for _, v := range jobStates {
		if s == v {
			return true
		}
	}
	return false
}

func (a *app) listJobs(ctx context.Context, f client.JobFilter) error {
	return a.withClient(ctx, func(ctx context.Context, c *client.Client) error {
		jobs, err := c.Jobs(ctx, f)
		if err != nil {
			return err
		}
		return a.printJobs(jobs)
	})
}

func (a *app) printJobs(jobs []client.JobSummary) error {
	if a.json {
		if jobs == nil {
			jobs = []client.JobSummary{}
		}
		return writeJSON(a.stdout, jobs)
	}
	now := time.Now()
	t := newTable(a.stdout, "ID", "NAME", "STATE", "STEPS", "CREATED", "AGE")
	for _, j := range jobs {
		t.row(j.ID, oneLine(j.Name, 40), string(j.State), fmt.Sprintf("%d/%d", j.StepsDone, j.StepsTotal), timestamp(j.CreatedAt), age(j.CreatedAt, now))
	}
	return t.flush()
}
