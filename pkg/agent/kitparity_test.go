package agent_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/agent/agenttest"
	"github.com/wardenhq/warden/pkg/protocol"
)

// agenttest.Run reports what an agent reports for the same handler and
// task: its error text (by which retries classify a step as a timeout,
// internal/retry) and the cut of an oversized result. The kit ran the bare
// handler: a context error came back without "step deadline reached", and
// a 512 KiB output uncut.
func TestAgenttestRunMatchesAgent(t *testing.T) {
	t.Parallel()
	handlers := map[string]agent.HandlerFunc{
		"ctx_err": func(ctx context.Context, _ *agent.Task) (any, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
		"own_err": func(ctx context.Context, _ *agent.Task) (any, error) {
			<-ctx.Done()
			return nil, agent.Retriable(errors.New("gave up"))
		},
		"big": func(context.Context, *agent.Task) (any, error) {
			return strings.Repeat("x", 2*agent.DefaultMaxResultBytes), nil
		},
		"big_err": func(context.Context, *agent.Task) (any, error) {
			return nil, agent.Permanent(errors.New(strings.Repeat("e", 20<<10)))
		},
	}
	b := setup(t, testConfig("a1"), func(a *agent.Agent) {
		for name, h := range handlers {
			a.Handle(name, h)
		}
	})
	for name, h := range handlers {
		timeout := protocol.Duration(100 * time.Millisecond)
		b.publish(t, protocol.Task{JobID: "j1", StepID: name, Action: name, Timeout: timeout})
		got, _ := b.result(t, "j1", name)
		kit := agenttest.Run(t, h, agenttest.WithTimeout(agenttest.NewTask(t, name, nil), timeout.Std()))
		if kit.Status != got.Status || kit.Error != got.Error || kit.ErrorClass != got.ErrorClass ||
			kit.Truncated != got.Truncated || string(kit.Output) != string(got.Output) {
			t.Errorf("%s: the kit reports\n%.300s\nan agent\n%.300s", name, brief(kit), brief(got))
		}
	}
}

// brief is r's fields the kit must match, each cut short.
func brief(r protocol.Result) string {
	cut := func(s string) string { return s[:min(len(s), 80)] }
	return "status=" + r.Status + " class=" + r.ErrorClass + " truncated=" + map[bool]string{true: "yes", false: "no"}[r.Truncated] +
		" error=" + cut(r.Error) + " output=" + cut(string(r.Output))
}
