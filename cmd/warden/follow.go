package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/client"
)

func (a *app) followCommand() *cobra.Command {
	var waitTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "follow ID",
		Short: "Follow a job live, one line per step or job state change, until it ends; exit 0 only if it succeeded",
		Long: `Follow prints the job's steps and state as they are now, then a line for
every change of a step's state, attempt, agent or epoch and of the job's
state, until the job ends (as submit --wait does; a state replaced before
the watch read it is not shown). It exits 0 if the job
succeeded, 1 if it ended otherwise (failed, cancelled, ...), 3 if there is no
such job, 4 when --wait-timeout ends the follow first (the job goes on) or on
Ctrl-C. A job already ended prints its steps and exits at once. With --json
the lines go to stderr and stdout gets the final job as job show --json
prints it.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return a.follow(cmd.Context(), args[0], waitTimeout) },
	}
	cmd.Flags().DurationVar(&waitTimeout, "wait-timeout", 0, "give up after this long (exit 4); 0 follows until the job ends")
	return cmd
}

func (a *app) follow(ctx context.Context, id string, waitTimeout time.Duration) error {
	c, err := a.connect()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, stop := a.perm.bind(ctx)
	defer stop()

	// client.Follow waits for a job that has no record yet, as a
	// submission just made has none: an id that names nothing would be
	// followed for ever. Looked up first, as job show does (a job held
	// until its start time, or queued for a scheduler, is found).
	lookup := func() (client.JobDetail, error) {
		lctx, cancel := ctx, context.CancelFunc(func() {})
		if a.timeout > 0 {
			lctx, cancel = context.WithTimeout(ctx, a.timeout)
		}
		defer cancel()
		return c.Job(lctx, id)
	}
	d, err := lookup()
	if err != nil {
		return err
	}

	job, err := a.watchJob(ctx, id, d.StartsAt, waitTimeout, func(ctx context.Context, update func(client.Update)) (*client.Job, error) {
		return c.Follow(ctx, id, update)
	})
	if err != nil {
		return err
	}
	if a.json {
		if d, err = lookup(); err != nil {
			return err
		}
		if err := writeJSON(a.stdout, d); err != nil {
			return err
		}
	}
	if job.State != jobstore.JobSucceeded {
		return &exitError{code: exitJobFailed}
	}
	return nil
}
