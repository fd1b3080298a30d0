// Command scheduler turns submissions into jobs, dispatches ready steps and
// consumes results. Run as many as you like against the same NATS.
// `scheduler --help` lists its flags (internal/daemon: the same for every
// process).
package main

import (
	"os"

	"github.com/wardenhq/warden/internal/daemon"
)

func main() {
	ctx, stop := daemon.SignalContext()
	defer stop()
	daemon.Exit("scheduler", daemon.Scheduler.Run(ctx, os.Args[1:]))
}
