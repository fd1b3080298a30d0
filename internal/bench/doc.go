// Package bench is Warden's benchmark suite, run by cmd/bench (`make bench`).
//
// It measures, in one run and against identically configured NATS servers
// (file storage, R1, a fresh temporary store per phase):
//
//   - raw: plain JetStream — synchronous and asynchronous publish, pull
//     consume with explicit acks and KV put — the baseline every Warden
//     figure is also reported against, and the job-shaped pipeline:
//     Warden's messages with no Warden work (rawjob.go);
//   - throughput: single-step jobs kept in flight for a fixed time, the
//     JetStream writes one job costs (counted from the streams' sequence
//     numbers, not estimated), the server's and Warden's CPU meanwhile,
//     and 10-step chains;
//   - latency: submit→complete at low load, submit→dispatch at half of the
//     measured maximum, then the job-shaped pipeline paced at that same
//     rate (the broker's own tail there);
//   - dag: a 1,000-step fan-out, a 100-step chain, single-step probes
//     while a 1,000-step job runs, and the cancel of a running 1,000-step
//     job;
//   - delayed: how late jobs submitted for a later time start;
//   - concurrency: throughput of jobs sharing one concurrency key;
//   - history: after 20,000 finished jobs, job listings, a fresh
//     supervisor's start and a new job's latency;
//   - failover: agents killed with SIGKILL while holding steps, and the
//     supervisor leader killed, with real processes and default settings;
//   - cluster: the leader of an active_passive agent cluster killed;
//   - scale: 100, 1,000 and 5,000 agents in one process sharing
//     connections: idle cost, targeted tasks/s, one selection decision;
//   - memory: scheduler and supervisor RSS with a million queued steps.
//
// Every agent is the SDK runtime (pkg/agent) users run — in-process fleets
// of them (fleet.go) or agent processes — so there is no second
// implementation of the agent protocol here. A job's end is its job record
// turning terminal in the job store (its Warden-State header).
//
// Timings are measured and reported here, never asserted in tests. Results
// are a flat JSON object (bench/results/latest.json) so that two runs can be
// compared; the same figures are also written in the Go benchmark format
// for benchstat and as Markdown tables.
package bench
