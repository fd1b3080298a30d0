// Command supervisor recovers what fails: run two or more; one leads.
// `supervisor --help` lists its flags (internal/daemon: the same for every
// process).
package main

import (
	"os"

	"github.com/wardenhq/warden/internal/daemon"
)

func main() {
	ctx, stop := daemon.SignalContext()
	defer stop()
	daemon.Exit("supervisor", daemon.Supervisor.Run(ctx, os.Args[1:]))
}
