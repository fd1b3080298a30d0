// Package agenttest helps users test their agent handlers without NATS:
// build a Task, run the handler the way the agent runs it (panic recovery,
// error classification, JSON output), and look at the protocol.Result the
// scheduler would receive.
//
//	res := agenttest.Run(t, resize, agenttest.NewTask(t, "resize", map[string]int{"width": 10}))
//	if res.Status != protocol.ResultSucceeded { t.Fatal(res.Error) }
//
// StartAgent runs a real agent against a server (the SDK runtime, on its
// own connection) whose handler the test scripts: succeed, fail, hold the
// task, drop it unreported, crash (Stop) or leave (Leave), and look as
// healthy or sick as needed (Report). Tests of schedulers, supervisors and
// tools use it instead of speaking the agent protocol by hand.
//
//	a := agenttest.StartAgent(t, nc, agent.Config{ID: "a1", Capabilities: []string{"gpu"}})
//	a.Script(func(ctx context.Context, t *agent.Task) (any, error) { return nil, agenttest.ErrDrop })
package agenttest
