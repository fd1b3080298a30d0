package main

import (
	"context"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/natsconn"
	"github.com/wardenhq/warden/pkg/client"
)

// app holds what every command shares: streams and global flags.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	server  string
	creds   string
	json    bool
	timeout time.Duration

	// started is set once a command's own code runs, so that errors before
	// that (cobra's parsing) are reported as usage errors.
	started bool
	// perm reports a refusal by the server as such (exit 5).
	perm permissions
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "warden",
		Short: "Submit and inspect Warden jobs, list agents, run Warden locally",
		Long: `warden talks to a Warden deployment through NATS.

The server comes from --server or NATS_URL (default ` + natsconn.DefaultURL + `),
credentials from --creds or NATS_CREDS, as with the nats CLI.

Exit codes: 0 ok, 1 job failed or cancelled (submit --wait), 2 usage error or
invalid spec, 3 not found, 4 NATS, connection or timeout error, 5 permission
denied (the credential's role may not do this: docs/security.md).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			a.started = true
			return nil
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError("%v", err) })
	f := root.PersistentFlags()
	f.StringVar(&a.server, "server", "", "NATS server URL(s) (default $NATS_URL or "+natsconn.DefaultURL+")")
	f.StringVar(&a.creds, "creds", "", "NATS credentials file (default $NATS_CREDS)")
	f.BoolVar(&a.json, "json", false, "print machine-readable JSON")
	f.DurationVar(&a.timeout, "timeout", 10*time.Second, "bound on each NATS operation, and on the wait for the scheduler's reply to a submission")

	root.AddCommand(a.submitCommand(), a.jobsCommand(), a.jobCommand(), a.agentsCommand(), a.agentCommand(), a.dlqCommand(), a.healingCommand(), a.devCommand(),
		a.clusterCommand(), a.failoversCommand(), a.apiCommand())
	root.AddCommand(a.scheduleCommand())
	root.AddCommand(a.credsCommand(), a.setupCommand())
	refuseUnknownSubcommands(root)
	return root
}

// refuseUnknownSubcommands makes every command that only groups others
// (job, dlq, agent, ...) refuse a word it does not know: cobra rejects
// unknown words only at the root, so `warden job folow j1` printed the
// help and exited 0, as if it had run. Without arguments the help is
// still printed.
func refuseUnknownSubcommands(root *cobra.Command) {
	for _, c := range root.Commands() {
		refuseUnknownSubcommands(c)
		if !c.HasSubCommands() || c.Run != nil || c.RunE != nil {
			continue
		}
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return usageError("unknown command %q for %q (see %s --help)", args[0], cmd.CommandPath(), cmd.CommandPath())
		}
	}
}

// connect opens a client with the global flags.
func (a *app) connect() (*client.Client, error) {
	c, err := client.Connect(a.server, client.Options{Creds: a.creds, Name: "warden-cli", ReplyTimeout: a.timeout})
	if err != nil {
		return nil, &exitError{code: exitUnavailable, err: err}
	}
	natsconn.OnPermissionError(c.JetStream().Conn(), a.perm.denied)
	return c, nil
}

// withClient connects, runs f within --timeout and closes the connection:
// the shape of every command but submit, which times its own wait.
func (a *app) withClient(ctx context.Context, f func(context.Context, *client.Client) error) error {
	c, err := a.connect()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := a.opContext(ctx)
	defer cancel()
	return f(ctx, c)
}

// opContext bounds one inspection by --timeout.
func (a *app) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, stop := a.perm.bind(ctx)
	if a.timeout <= 0 {
		return ctx, stop
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	return ctx, func() { cancel(); stop() }
}

// exactArgs is cobra.ExactArgs reporting a usage error.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.ExactArgs(n)(cmd, args); err != nil {
			return usageError("%s: %v", cmd.CommandPath(), err)
		}
		return nil
	}
}
