// Package e2e tests Warden across real processes: the scheduler,
// supervisor, agent and warden binaries (built once by TestMain with
// test/procs) against an embedded NATS server. A test here exercises a
// process boundary — exit codes, flags, kill -9, a second agent with a
// taken id — which an in-process test cannot.
//
// Invariants: no sleeps-and-hope (natstest.Eventually, procs.WaitOutput);
// every process is stopped when its test ends.
package e2e
