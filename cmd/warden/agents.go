package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

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
	c, err := a.connect()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := a.opContext(ctx)
	defer cancel()
	agents, err := c.Agents(ctx)
	if err != nil {
		return err
	}
	if a.json {
		if agents == nil {
			agents = []protocol.Presence{}
		}
		return writeJSON(a.stdout, agents)
	}
	now := time.Now()
	t := newTable(a.stdout, "ID", "POOL", "CAPABILITIES", "LOAD", "SUCCEEDED", "FAILED", "HEARTBEAT", "VERSION", "DRAINING")
	for _, p := range agents {
		draining := "no"
		if p.Draining {
			draining = "yes"
		}
		t.row(p.ID, p.Pool, strings.Join(p.Capabilities, ","), fmt.Sprintf("%d/%d", p.InFlight, p.MaxConcurrent),
			fmt.Sprint(p.Succeeded), fmt.Sprint(p.Failed), until(p.HeartbeatAt, now), p.Version, draining)
	}
	return t.flush()
}
