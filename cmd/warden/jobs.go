package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/ops"
)

type jobsFlags struct {
	states []string
	since  time.Duration
	before time.Duration
	limit  int
	page   string
}

func (a *app) jobsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "jobs", Short: "List jobs"}
	var f jobsFlags
	ls := &cobra.Command{
		Use:     "ls [--state STATE[,STATE]] [--since AGE] [--before AGE] [--limit N] [--page CURSOR]",
		Aliases: []string{"list"},
		Short:   "List jobs, newest first, one page at a time",
		Long: `ls lists jobs newest first, --limit per page. It reads only the job
records' headers to filter and order, then the records of the page shown, so
it answers quickly however many finished jobs the store keeps (finished
jobs are removed after their retention, shown in EXPIRES).

When there are more jobs, the cursor of the next page is printed on stderr:
pass it to --page.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			lf, err := f.filter(time.Now())
			if err != nil {
				return err
			}
			return a.listJobs(cmd.Context(), lf)
		},
	}
	fl := ls.Flags()
	fl.StringSliceVar(&f.states, "state", nil, fmt.Sprintf("only jobs in these states %v", ops.JobStates))
	fl.DurationVar(&f.since, "since", 0, "only jobs created within this long (e.g. 1h)")
	fl.DurationVar(&f.before, "before", 0, "only jobs created more than this long ago (e.g. 24h)")
	fl.IntVar(&f.limit, "limit", jobstore.DefaultListLimit, fmt.Sprintf("jobs per page (at most %d)", jobstore.MaxListLimit))
	fl.StringVar(&f.page, "page", "", "continue after a previous page (the cursor it printed)")
	cmd.AddCommand(ls)
	return cmd
}

func (f jobsFlags) filter(now time.Time) (jobstore.ListFilter, error) {
	lf := jobstore.ListFilter{Limit: f.limit, Cursor: f.page}
	for _, s := range f.states {
		st := jobstore.JobState(strings.TrimSpace(s))
		if !ops.ValidJobState(st) {
			return lf, usageError("--state %q: want one of %v", s, ops.JobStates)
		}
		lf.States = append(lf.States, st)
	}
	if f.limit < 1 || f.limit > jobstore.MaxListLimit {
		return lf, usageError("--limit %d: want 1 to %d", f.limit, jobstore.MaxListLimit)
	}
	if f.since < 0 || f.before < 0 {
		return lf, usageError("--since and --before take a positive age")
	}
	if f.since > 0 {
		lf.CreatedAfter = now.Add(-f.since)
	}
	if f.before > 0 {
		lf.CreatedBefore = now.Add(-f.before)
	}
	return lf, nil
}

func (a *app) listJobs(ctx context.Context, f jobstore.ListFilter) error {
	return a.withOps(ctx, func(ctx context.Context, o *ops.Ops) error {
		p, err := o.ListJobs(ctx, f)
		if err != nil {
			return err
		}
		return a.printJobs(p)
	})
}

func (a *app) printJobs(p ops.JobsPage) error {
	if a.json {
		return writeJSON(a.stdout, p)
	}
	now := time.Now()
	t := newTable(a.stdout, "ID", "NAME", "STATE", "STEPS", "CREATED", "AGE", "EXPIRES")
	for _, j := range p.Jobs {
		t.row(j.ID, oneLine(j.Name, 40), string(j.State), fmt.Sprintf("%d/%d", j.StepsDone, j.StepsTotal),
			timestamp(j.Created), age(j.Created, now), until(j.ExpiresAt, now))
	}
	if err := t.flush(); err != nil {
		return err
	}
	var counts []string
	for _, s := range ops.JobStates {
		if n := p.Counts[s]; n > 0 {
			counts = append(counts, fmt.Sprintf("%s %d", s, n))
		}
	}
	fmt.Fprintf(a.stderr, "%d of %d matching jobs shown (store: %s)\n", len(p.Jobs), p.Matched, orDash(strings.Join(counts, ", ")))
	if p.Next != "" {
		fmt.Fprintf(a.stderr, "next page: --page %s\n", p.Next)
	}
	return nil
}
