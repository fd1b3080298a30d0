package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
)

func (a *app) agentsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "agents", Short: "List agents"}
	cmd.AddCommand(&cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List present agents: pool, capabilities, load, results, last heartbeat",
		Args:    exactArgs(0),
		RunE:    func(cmd *cobra.Command, _ []string) error { return a.listAgents(cmd.Context()) },
	})
	return cmd
}

func (a *app) listAgents(ctx context.Context) error {
	return a.withClient(ctx, a.printAgents)
}

func (a *app) printAgents(ctx context.Context, c *client.Client) error {
	agents, err := c.Agents(ctx)
	if err != nil {
		return err
	}
	// Assessments exist once a supervisor leader has run; without them the
	// list still shows presence.
	records, _ := health.ListRecords(ctx, c.JetStream())
	if a.json {
		type agentJSON struct {
			protocol.Presence
			Health *health.Record `json:"health,omitempty"`
		}
		out := []agentJSON{}
		for _, p := range agents {
			row := agentJSON{Presence: p}
			if r, ok := records[protocol.PresenceKey(p.Pool, p.ID)]; ok {
				row.Health = &r
			}
			out = append(out, row)
		}
		return writeJSON(a.stdout, out)
	}
	now := time.Now()
	t := newTable(a.stdout, "ID", "POOL", "CAPABILITIES", "LOAD", "SUCCEEDED", "FAILED", "HEALTH", "SCORE", "HEARTBEAT", "VERSION", "DRAINING")
	for _, p := range agents {
		draining := "no"
		if p.Draining {
			draining = "yes"
		}
		level, score := "unknown", ""
		if r, ok := records[protocol.PresenceKey(p.Pool, p.ID)]; ok {
			level, score = r.Level.String(), fmt.Sprintf("%.2f", r.Score)
			if r.Action != "" {
				level += " (" + r.Action + ")"
			}
		}
		t.row(p.ID, p.Pool, strings.Join(p.Capabilities, ","), fmt.Sprintf("%d/%d", p.InFlight, p.MaxConcurrent),
			fmt.Sprint(p.Succeeded), fmt.Sprint(p.Failed), level, score, until(p.HeartbeatAt, now), p.Version, draining)
	}
	return t.flush()
}
