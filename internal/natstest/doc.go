// Package natstest starts an embedded JetStream server for tests: random port,
// temporary store, shut down when the test ends.
//
// Start is the setup most tests need: a server, a connection and Warden's
// streams and buckets (streams.Ensure). Eventually waits on a condition with
// a deadline.
//
// Invariants: every server, connection and directory a helper creates is
// torn down by t.Cleanup; no helper sleeps in place of a condition.
package natstest
