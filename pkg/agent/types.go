package agent

import (
	"github.com/wardenhq/warden/internal/actions"
	"github.com/wardenhq/warden/internal/natsconn"
)

// Types of Config fields, named here so that programs can build them.
type (
	// ShellConfig configures the shell built-in (Config.Shell): the
	// commands it may run, working directory, environment, output tail.
	ShellConfig = actions.ShellConfig
	// HTTPConfig configures the http built-in (Config.HTTP): the hosts it
	// may call, timeouts, output tail.
	HTTPConfig = actions.HTTPConfig
	// NATSOptions say where to connect (Config.NATS): URL (YAML server)
	// and Creds, defaulting to $NATS_URL and $NATS_CREDS.
	NATSOptions = natsconn.Options
)
