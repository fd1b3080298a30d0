// Package agent is Warden's agent SDK and runtime. A program registers
// handlers and runs:
//
//	a, err := agent.New(cfg, agent.WithLogger(log))
//	a.Handle("resize", func(ctx context.Context, t *agent.Task) (any, error) {
//		var p struct{ Width int `json:"width"` }
//		if err := t.Bind(&p); err != nil {
//			return nil, err // permanent: bad params
//		}
//		return resize(ctx, p.Width)
//	})
//	err = a.Run(ctx) // returns after ctx ends and the drain finished
//
// The agent owns a durable pull consumer named after its id on its task
// shard stream (warden.task.<shard>.<pool>.<agent>) and its presence key
// <pool>.<agent>. Guarantees:
//   - Only actions the configuration allows run (Config.Actions); any other
//     task is answered with a permanent "unknown action" failure.
//   - At most MaxConcurrent tasks run; a task is pulled only when a slot is
//     free, so none waits in the agent while its lease runs. A handler that
//     ignores its context's end is reported without after a short grace,
//     but keeps its slot (and, a suspect's, the right to run alone) until
//     it returns (Stats.Abandoned).
//   - While a handler runs its lease is extended every lease/3, and an
//     extension counts only once the server confirmed it. If the lease we are
//     sure of runs out, the handler's context is cancelled with ErrLeaseLost
//     and nothing is reported: the task may already run elsewhere.
//   - A handler's context ends a margin before the step's deadline (and at
//     most the step's timeout after start), with cause ErrDeadline, so the
//     failure is reported in time. Nothing is published at or after the
//     deadline; a task that arrives too late is not run.
//   - A task message that cannot be decoded, or whose deadline passed, is
//     copied to warden.dlq.<pool>.<agent> (Warden-DLQ-Reason undecodable or
//     expired) and only then terminated, so nothing vanishes unrecorded.
//   - The result is published (deduplicated by Nats-Msg-Id
//     <job>.<step>.<epoch>.<token>) and stored (PubAck) before the task is
//     acked: a task is never lost in between. The ack itself is a plain
//     publish, not confirmed: if it is lost, the redelivery is acked unrun
//     while this agent remembers the result (recentReports), which it
//     publishes again unchanged, or else runs again, and its result is
//     deduplicated or fenced by epoch. So is a task published again.
//   - A handler's error decides the result: Permanent, Retriable and
//     RetryAfter set error_class and retry_after; any error with an
//     ErrorClass() string method is classified the same way; other errors
//     carry no class and the scheduler decides. A panic is a failure.
//   - Cancelling Run's context drains: presence says draining, no task is
//     fetched, in-flight tasks get DrainTimeout, the rest are cancelled with
//     ErrShutdown and handed back (Nak), then the presence key is deleted.
//   - A connection closed for good (its reconnects spent, or closed by its
//     owner) cancels the handlers in flight at once, with
//     ErrConnectionClosed, and their tasks are abandoned unreported: the
//     supervisor re-dispatches them. Run returns an error wrapping
//     nats.ErrConnectionClosed without waiting out the drain.
//   - A result is cut to fit max_result_bytes and the server's
//     max_payload: the output to {"truncated": true, "original_bytes": n,
//     "head": "…"}, n the size of the handler's output, the error too if
//     need be.
//
// Execution is at least once: handlers must be idempotent. Package
// agenttest runs a handler against a task without NATS, through the same
// code (Execute).
package agent
