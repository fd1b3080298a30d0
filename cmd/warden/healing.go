package main

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/pkg/protocol"
)

func (a *app) healingCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "healing", Short: "The self-healing history"}
	var limit int
	ls := &cobra.Command{
		Use: "ls", Short: "List self-healing actions, newest last", Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.connect()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := a.opContext(cmd.Context())
			defer cancel()
			events, err := readEvents(ctx, c.JetStream(), "healing", limit)
			if err != nil {
				return &exitError{code: exitUnavailable, err: err}
			}
			if a.json {
				if events == nil {
					events = []protocol.Event{}
				}
				return writeJSON(a.stdout, events)
			}
			t := newTable(a.stdout, "TIME", "AGENT", "POOL", "ACTION", "FROM", "LEVEL", "SCORE", "OUTCOME", "REASONS")
			for _, e := range events {
				t.row(timestamp(e.Time), e.Agent, e.Data["pool"], e.Data["action"], e.Data["from"], e.Data["level"],
					e.Data["score"], e.Data["outcome"], e.Reason)
			}
			return t.flush()
		},
	}
	ls.Flags().IntVar(&limit, "limit", 100, "show at most the last N actions (0: all)")
	cmd.AddCommand(ls)
	return cmd
}

// readEvents reads the stored events of a kind, oldest first, keeping the
// last limit (0: all).
func readEvents(ctx context.Context, js jetstream.JetStream, kind string, limit int) ([]protocol.Event, error) {
	s, err := js.Stream(ctx, protocol.StreamEvents)
	if err != nil {
		return nil, err
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{protocol.EventSubject(kind, ">")}})
	if err != nil {
		return nil, err
	}
	var out []protocol.Event
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(300 * time.Millisecond))
		if err != nil {
			break
		}
		var e protocol.Event
		if json.Unmarshal(m.Data(), &e) == nil {
			out = append(out, e)
		}
		if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
			break
		}
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}
