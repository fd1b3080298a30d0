// Package bench is Warden's benchmark suite, run by cmd/bench (`make bench`).
//
// It measures, in one run and against identically configured NATS servers
// (file storage, R1, a fresh temporary store per phase):
//
//   - raw JetStream: synchronous and asynchronous publish, pull consume
//     with explicit acks and KV put, the baseline every Warden figure is
//     compared with;
//   - Warden throughput: single-step jobs, 10-step chains and a 100-step
//     fan-out, with the JetStream writes one job costs (counted from the
//     streams' sequence numbers, not estimated);
//   - latency at low load and at half of the measured maximum;
//   - failover: agents killed with SIGKILL while holding steps, and the
//     supervisor leader killed, with real processes and default settings;
//   - scale: 100, 1,000 and 5,000 simulated agents ("light agents": many
//     per process sharing connections, each with presence, a durable task
//     consumer and a no-op handler that reports per docs/protocol.md);
//   - memory: scheduler and supervisor RSS with many queued steps.
//
// Timings are measured and reported here, never asserted in tests. Results
// are a flat JSON object (bench/results/latest.json) so that two runs can be
// compared; the same figures are also written in the Go benchmark format
// for benchstat.
package bench
