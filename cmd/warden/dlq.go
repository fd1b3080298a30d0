package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/client"
)

func (a *app) dlqCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "dlq", Short: "Inspect, retry and purge dead-lettered tasks (stream WARDEN_DLQ)"}
	var limit int
	ls := &cobra.Command{
		Use: "ls", Short: "List dead letters, oldest first", Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withDLQ(cmd.Context(), func(ctx context.Context, q *dlq.Queue, c *client.Client) error {
				letters, err := q.List(ctx, limit)
				if err != nil {
					return err
				}
				if a.json {
					if letters == nil {
						letters = []dlq.Letter{} // [], as the HTTP API answers, not null
					}
					return writeJSON(a.stdout, letters)
				}
				t := newTable(a.stdout, "ID", "JOB", "STEP", "EPOCH", "REASON", "DELIVERIES", "AGE", "DETAIL")
				now := time.Now()
				for _, l := range letters {
					t.row(strconv.FormatUint(l.ID, 10), l.JobID, l.StepID, l.Epoch, l.Reason, l.Deliveries, age(l.Time, now), l.Detail)
				}
				return t.flush()
			})
		},
	}
	ls.Flags().IntVar(&limit, "limit", 100, "list at most this many (0: all)")
	show := &cobra.Command{
		Use: "show ID", Short: "Show one dead letter: headers, payload and why it was parked", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := dlq.ParseID(args[0])
			if err != nil {
				return usageError("%v", err)
			}
			return a.withDLQ(cmd.Context(), func(ctx context.Context, q *dlq.Queue, c *client.Client) error {
				l, err := q.Get(ctx, id)
				if err != nil {
					return err
				}
				if a.json {
					return writeJSON(a.stdout, l)
				}
				fmt.Fprintf(a.stdout, "Dead letter %d on %s at %s\n", l.ID, l.Subject, timestamp(l.Time))
				fmt.Fprintf(a.stdout, "Step:       %s.%s (epoch %s)\n", l.JobID, l.StepID, l.Epoch)
				fmt.Fprintf(a.stdout, "Reason:     %s: %s\n", l.Reason, l.Detail)
				fmt.Fprintf(a.stdout, "Deliveries: %s\n", l.Deliveries)
				if l.LastError != "" {
					fmt.Fprintf(a.stdout, "Last error: %s\n", l.LastError)
				}
				fmt.Fprintln(a.stdout, "Headers:")
				for k, v := range l.Headers {
					fmt.Fprintf(a.stdout, "  %s: %v\n", k, v)
				}
				fmt.Fprintf(a.stdout, "Payload:\n  %s\n", l.Payload)
				return nil
			})
		},
	}
	retry := &cobra.Command{
		Use: "retry ID", Short: "Put the dead letter's step back with a fresh attempt budget, then remove the letter", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := dlq.ParseID(args[0])
			if err != nil {
				return usageError("%v", err)
			}
			return a.withDLQ(cmd.Context(), func(ctx context.Context, q *dlq.Queue, c *client.Client) error {
				store, err := jobstore.Open(ctx, c.JetStream())
				if err != nil {
					return err
				}
				l, err := q.Retry(ctx, store, id)
				if err != nil {
					return err
				}
				if a.json {
					return writeJSON(a.stdout, map[string]any{"retried": l.ID, "job_id": l.JobID, "step_id": l.StepID})
				}
				fmt.Fprintf(a.stdout, "retried dead letter %d: step %s of job %s is pending again\n", l.ID, l.StepID, l.JobID)
				return nil
			})
		},
	}
	var yes bool
	purge := &cobra.Command{
		Use: "purge", Short: "Delete every dead letter", Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !yes {
				return usageError("purge deletes every dead letter for good; pass --yes to confirm")
			}
			return a.withDLQ(cmd.Context(), func(ctx context.Context, q *dlq.Queue, c *client.Client) error {
				n, err := q.Purge(ctx)
				if err != nil {
					return err
				}
				if a.json {
					return writeJSON(a.stdout, map[string]uint64{"purged": n})
				}
				fmt.Fprintf(a.stdout, "purged %d dead letters\n", n)
				return nil
			})
		},
	}
	purge.Flags().BoolVar(&yes, "yes", false, "confirm the purge")
	cmd.AddCommand(ls, show, retry, purge)
	return cmd
}

// withDLQ connects, opens the dead-letter stream and runs f within --timeout.
func (a *app) withDLQ(ctx context.Context, f func(context.Context, *dlq.Queue, *client.Client) error) error {
	return a.withClient(ctx, func(ctx context.Context, c *client.Client) error {
		q, err := dlq.Open(ctx, c.JetStream().Conn(), c.JetStream())
		if err != nil {
			return &exitError{code: exitUnavailable, err: err}
		}
		return f(ctx, q, c)
	})
}
