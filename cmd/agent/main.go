// Command agent runs a Warden agent with the built-in actions (echo, sleep,
// shell, http). Programs with their own actions embed pkg/agent instead.
// `agent --help` lists its flags (internal/daemon: the same for every
// process).
//
// Exit codes: 0 after a clean drain, 1 on any error (including another live
// agent with the same id, which the message names).
package main

import (
	"os"

	"github.com/wardenhq/warden/internal/daemon"
)

func main() {
	ctx, stop := daemon.SignalContext()
	defer stop()
	daemon.Exit("agent", daemon.Agent.Run(ctx, os.Args[1:]))
}
