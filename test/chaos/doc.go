// Package chaos is the fault-injection suite: real processes under a steady
// load of jobs while agents, schedulers, the supervisor leader and
// nats-server are killed, paused (SIGSTOP) and restarted, and processes are
// partitioned from nats-server through a proxy (partition_test.go). It
// checks the promises: no accepted job is lost, nothing runs twice in
// state, every job reaches a terminal state. `make test` runs a short
// seeded form; `make chaos` the full one (-chaos.full, -chaos.seed to
// replay a run).
package chaos
