package main

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
)

func (a *app) failoversCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "failovers", Short: "The failover history of agent clusters"}
	var clusterName string
	var limit int
	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List cluster failovers, newest last", Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				evs, err := a.failovers(ctx, c, clusterName, limit)
				if err != nil {
					return err
				}
				if a.json {
					return writeJSON(a.stdout, evs)
				}
				t := newTable(a.stdout, "ID", "TIME", "CLUSTER", "MODE", "FROM", "TO", "EPOCH", "REASON")
				for _, e := range evs {
					t.row(e.ID, timestamp(e.Time), e.Data["cluster"], e.Data["mode"], e.Data["from"], toText(e), e.Data["epoch"], e.Reason)
				}
				return t.flush()
			})
		},
	}
	ls.Flags().StringVar(&clusterName, "cluster", "", "only this cluster's failovers")
	ls.Flags().IntVar(&limit, "limit", 100, "show at most the last N failovers (0: all)")
	show := &cobra.Command{
		Use: "show ID", Short: "Show one failover: who, to whom, why, which shards moved", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(cmd.Context(), func(ctx context.Context, c *client.Client) error {
				evs, err := a.failovers(ctx, c, "", 0)
				if err != nil {
					return err
				}
				for _, e := range evs {
					if e.ID != args[0] {
						continue
					}
					if a.json {
						return writeJSON(a.stdout, e)
					}
					fmt.Fprintf(a.stdout, "Failover: %s\nTime:     %s\nAgent:    %s\nReason:   %s\n", e.ID, timestamp(e.Time), e.Agent, e.Reason)
					keys := make([]string, 0, len(e.Data))
					for k := range e.Data {
						keys = append(keys, k)
					}
					sort.Strings(keys)
					for _, k := range keys {
						fmt.Fprintf(a.stdout, "%-9s %s\n", k+":", e.Data[k])
					}
					return nil
				}
				return &exitError{code: exitNotFound, err: fmt.Errorf("no failover %q", args[0])}
			})
		},
	}
	cmd.AddCommand(ls, show)
	return cmd
}

func toText(e protocol.Event) string {
	if to := e.Data["to"]; to != "" {
		return to
	}
	if o := e.Data["owners"]; o != "" {
		return "shards -> " + o
	}
	if m := e.Data["members"]; m != "" {
		return "work -> " + m
	}
	return "-"
}

func (a *app) failovers(ctx context.Context, c *client.Client, clusterName string, limit int) ([]protocol.Event, error) {
	evs, err := events.List(ctx, c.JetStream(), protocol.EventClusterFailover, 0)
	if err != nil {
		return nil, &exitError{code: exitUnavailable, err: err}
	}
	out := []protocol.Event{}
	for _, e := range evs {
		if clusterName == "" || strings.EqualFold(e.Data["cluster"], clusterName) {
			out = append(out, e)
		}
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}
