package main

import (
	"errors"
	"flag"

	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/daemon"
)

// apiCommand runs the api process through internal/daemon, like the
// scheduler, supervisor and agent: the same flags (--config, --server,
// --creds, --log-level, --print-config), the same precedence (flag >
// environment > file > default) and the same --help; its own flags are
// --listen and --anonymous-scope.
func (a *app) apiCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "api [--config FILE] [--listen ADDR] [--anonymous-scope read|admin]",
		Short: "Serve the HTTP API (/api/v1), the web dashboard (/) and the warden-api NATS micro service",
		Long: `api runs until Ctrl-C or SIGTERM. It connects to NATS with its own identity
(--server/--creds, or nats: in the config), serves the API and dashboard on
--listen, /metrics, /healthz and /readyz on the same address, and registers
the warden-api micro service (nats micro ls). See docs/api.md and
configs/api.yaml. ` + "`warden api --help`" + ` lists every flag.`,
		// The daemon parses the flags, as every Warden process does.
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			a.started = true
			err := daemon.API.Run(cmd.Context(), args)
			var usage *daemon.UsageError
			switch {
			case errors.Is(err, flag.ErrHelp):
				return nil
			case errors.As(err, &usage):
				return usageError("%v", usage.Err)
			}
			return err
		},
	}
}
