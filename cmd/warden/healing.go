package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
)

func (a *app) healingCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "healing", Short: "The self-healing history"}
	var limit int
	ls := &cobra.Command{
		Use: "ls", Short: "List self-healing actions, newest last", Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				return a.printHealing(ctx, c, limit)
			})
		},
	}
	ls.Flags().IntVar(&limit, "limit", 100, "show at most the last N actions (0: the most, 10000)")
	cmd.AddCommand(ls)
	return cmd
}

func (a *app) printHealing(ctx context.Context, c *client.Client, limit int) error {
	evs, err := events.List(ctx, c.JetStream(), protocol.EventHealing, limit)
	if err != nil {
		return &exitError{code: exitUnavailable, err: err}
	}
	if a.json {
		if evs == nil {
			evs = []protocol.Event{}
		}
		return writeJSON(a.stdout, evs)
	}
	t := newTable(a.stdout, "TIME", "AGENT", "POOL", "ACTION", "FROM", "LEVEL", "SCORE", "OUTCOME", "REASONS")
	for _, e := range evs {
		t.row(timestamp(e.Time), e.Agent, e.Data["pool"], e.Data["action"], e.Data["from"], e.Data["level"],
			e.Data["score"], e.Data["outcome"], e.Reason)
	}
	return t.flush()
}
