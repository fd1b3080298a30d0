package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/ops"
	"github.com/wardenhq/warden/pkg/spec"
)

// withOps connects and runs f with operators' actions, within --timeout.
func (a *app) withOps(ctx context.Context, f func(context.Context, *ops.Ops) error) error {
	return a.withClient(ctx, func(ctx context.Context, c *client.Client) error {
		store, err := c.Store(ctx)
		if err != nil {
			return &exitError{code: exitUnavailable, err: err}
		}
		return f(ctx, ops.New(c.Conn(), store))
	})
}

func (a *app) jobOpsCommands() []*cobra.Command {
	cancel := &cobra.Command{
		Use: "cancel ID", Short: "Cancel a job: pending steps are cancelled, running ones interrupted through their agent", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withOps(cmd.Context(), func(ctx context.Context, o *ops.Ops) error {
				rep, err := o.CancelJob(ctx, args[0])
				if err != nil {
					return err
				}
				if a.json {
					return writeJSON(a.stdout, rep)
				}
				fmt.Fprintf(a.stdout, "job %s cancelled: %d pending steps cancelled, %d running steps interrupted (%s)",
					rep.JobID, len(rep.Cancelled), len(rep.Interrupted), strings.Join(rep.Interrupted, ", "))
				if len(rep.Unreached) > 0 {
					fmt.Fprintf(a.stdout, "; agents of %s did not confirm: those steps end cancelled when they report", strings.Join(rep.Unreached, ", "))
				}
				fmt.Fprintln(a.stdout)
				return nil
			})
		},
	}
	retry := &cobra.Command{
		Use: "retry ID", Short: "Retry a finished job's failed, dead-lettered and cancelled steps with a fresh attempt budget", Args: exactArgs(1),
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
