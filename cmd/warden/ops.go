package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/spec"
)

// withOps connects and runs f with operators' actions, within --timeout.
func (a *app) withOps(ctx context.Context, f func(context.Context, *ops.Ops) error) error {
	return a.withClient(ctx, func(ctx context.Context, c *client.Client) error {
		store, err := jobstore.Open(ctx, c.JetStream())
		if err != nil {
			return &exitError{code: exitUnavailable, err: err}
		}
		return f(ctx, ops.New(c.JetStream().Conn(), store))
	})
}

func (a *app) jobOpsCommands() []*cobra.Command {
	var noWait bool
	var compensate bool
	cancel := &cobra.Command{
		Use: "cancel ID", Short: "Cancel a job and wait until it has ended: pending steps are cancelled, running ones interrupted through their agent",
		Long: "Cancel a job. Its desired state becomes cancelled at once, durably: no step of it is dispatched again.\n" +
			"Steps not started end cancelled; running ones are told to stop and end cancelled when their agent\n" +
			"reports, or when their lease ends if it never does. The command waits until the job has ended\n" +
			"(Ctrl-C stops waiting, not the cancel); --no-wait returns once the cancel is recorded. Reads of the job\n" +
			"that fail are tried again until they have failed for --timeout in a row; a wait that stops still prints\n" +
			"the report, and its error says that the cancel is recorded and holds.",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			wait := cmd.Context() // waiting is bounded by the job, not by --timeout
			return a.withOps(cmd.Context(), func(ctx context.Context, o *ops.Ops) error {
				start := time.Now()
				cancelJob := o.CancelJob
				if compensate {
					cancelJob = o.CancelJobCompensate
				}
				rep, err := cancelJob(ctx, args[0])
				if err != nil {
					return err
				}
				var final *jobstore.Job
				if !noWait {
					// Reads that fail are tried again for --timeout in a row.
					if final, err = o.WaitJobPatiently(wait, args[0], 50*time.Millisecond, a.timeout); err != nil {
						// The cancel is recorded and holds; only the wait
						// failed. Say what the cancel did, and that, rather
						// than fail as if it had not happened (a script
						// cancelling again then read "conflict").
						return a.cancelWaitFailed(rep, err)
					}
				}
				if a.json {
					out := map[string]any{"report": rep}
					if final != nil {
						out["state"], out["took"] = final.State, time.Since(start).String()
					}
					return writeJSON(a.stdout, out)
				}
				a.printCancel(rep)
				if final != nil {
					fmt.Fprintf(a.stdout, "; job %s in %s", final.State, time.Since(start).Round(time.Millisecond))
				}
				fmt.Fprintln(a.stdout)
				return nil
			})
		},
	}
	cancel.Flags().BoolVar(&noWait, "no-wait", false, "return once the cancel is recorded, without waiting for the job to end")
	cancel.Flags().BoolVar(&compensate, "compensate", false, "then undo the steps that succeeded (their compensate: actions, in reverse dependency order); the job ends compensated or compensation_failed")
	retry := &cobra.Command{
		Use: "retry ID", Short: "Retry a job's failed, dead-lettered, cancelled and expired steps with a fresh attempt budget", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withOps(cmd.Context(), func(ctx context.Context, o *ops.Ops) error {
				steps, err := o.RetryJob(ctx, args[0])
				if err != nil {
					return err
				}
				if a.json {
					return writeJSON(a.stdout, map[string]any{"job_id": args[0], "reopened": steps})
				}
				fmt.Fprintf(a.stdout, "job %s: reopened %s\n", args[0], strings.Join(steps, ", "))
				return nil
			})
		},
	}
	return []*cobra.Command{cancel, retry}
}

// printCancel prints what a cancel did, without the line's end.
func (a *app) printCancel(rep ops.CancelReport) {
	fmt.Fprintf(a.stdout, "job %s cancelled: %s cancelled, %s interrupted",
		rep.JobID, countOf(len(rep.Cancelled), "pending step"), countOf(len(rep.Interrupted), "running step"))
	if len(rep.Interrupted) > 0 && len(rep.Interrupted) <= 10 {
		fmt.Fprintf(a.stdout, " (%s)", strings.Join(rep.Interrupted, ", "))
	}
}

// countOf is n and what it counts, plural unless n is 1: "1 pending step",
// "2 pending steps".
func countOf(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// cancelWaitFailed reports a cancel that took effect and a wait for the
// job's end that did not finish (reads failed for --timeout, Ctrl-C): the
// report on stdout, as for --no-wait, with "cancel_recorded" and
// "wait_error" in JSON; the error, which says the cancel holds, exits
// with its cause's code (4: NATS unavailable or a timeout).
func (a *app) cancelWaitFailed(rep ops.CancelReport, err error) error {
	var we *ops.WaitError
	var last *jobstore.Job
	if errors.As(err, &we) {
		last = we.Last
	}
	if a.json {
		out := map[string]any{"report": rep, "cancel_recorded": true, "wait_error": err.Error()}
		if last != nil {
			out["state"] = last.State
		}
		if werr := writeJSON(a.stdout, out); werr != nil {
			return werr
		}
	} else {
		a.printCancel(rep)
		fmt.Fprintln(a.stdout, "; the job has not ended yet")
	}
	return fmt.Errorf("job %s: the cancel is recorded and holds, but %w; `warden job show %s` shows how it ends", rep.JobID, err, rep.JobID)
}

func (a *app) agentCommand() *cobra.Command {
	var pool string
	cmd := &cobra.Command{Use: "agent", Short: "Drain, undrain or fail over one agent"}
	cmd.PersistentFlags().StringVar(&pool, "pool", spec.DefaultPool, "the agent's pool")
	simple := func(use, short string, f func(*ops.Ops, context.Context, string, string) error, done string) *cobra.Command {
		return &cobra.Command{
			Use: use + " ID", Short: short, Args: exactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return a.withOps(cmd.Context(), func(ctx context.Context, o *ops.Ops) error {
					if err := f(o, ctx, pool, args[0]); err != nil {
						return err
					}
					if a.json {
						return writeJSON(a.stdout, map[string]string{"pool": pool, "id": args[0], "result": use + "ed"})
					}
					fmt.Fprintf(a.stdout, "agent %s.%s %s\n", pool, args[0], done)
					return nil
				})
			},
		}
	}
	failover := &cobra.Command{
		Use: "failover ID", Short: "Drain the agent (if it is alive) and move its queued tasks to other agents now", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withOps(cmd.Context(), func(ctx context.Context, o *ops.Ops) error {
				if err := o.DrainAgent(ctx, pool, args[0]); err != nil {
					fmt.Fprintf(a.stderr, "note: %v (failing over anyway)\n", err)
				}
				msg, err := o.FailoverAgent(ctx, pool, args[0])
				if err != nil {
					return err
				}
				if a.json {
					return writeJSON(a.stdout, map[string]string{"pool": pool, "id": args[0], "result": msg})
				}
				fmt.Fprintln(a.stdout, msg)
				return nil
			})
		},
	}
	cmd.AddCommand(
		simple("drain", "Stop the agent taking new tasks; running ones finish", (*ops.Ops).DrainAgent, "drained: it takes no new tasks"),
		simple("undrain", "Let a drained agent take tasks again", (*ops.Ops).UndrainAgent, "undrained"),
		failover,
	)
	return cmd
}
