// Package daemon is the one main of every long-running Warden process
// (scheduler, supervisor, agent): the same flags, the same configuration
// precedence — flag > environment variable > --config file > default — the
// same --help and --print-config, the same logger, NATS connection and
// /metrics, and signal handling in one place.
//
// A process is a Process value (see processes.go); cmd/<name>/main.go is a
// few lines:
//
//	func main() {
//		ctx, stop := daemon.SignalContext()
//		defer stop()
//		daemon.Exit("scheduler", daemon.Scheduler.Run(ctx, os.Args[1:]))
//	}
//
// Invariants: a setting's flag, environment variable (EnvName) and YAML
// field name the same thing; a flag or variable overrides the file only
// when it is set; the first SIGINT/SIGTERM cancels the context (a drain),
// a second one kills.
package daemon
