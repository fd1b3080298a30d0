package natsconn

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// DefaultURL is used when neither a flag nor NATS_URL names a server.
const DefaultURL = "nats://127.0.0.1:4222"

// Options say where and how to connect.
type Options struct {
	// URL of the server(s), comma separated. Defaults to NATS_URL, then DefaultURL.
	URL string `yaml:"server"`
	// Creds is a credentials file. Defaults to NATS_CREDS.
	Creds string `yaml:"creds"`
	// CA is the PEM file of the CA that signed the servers' certificates
	// (a TLS deployment). NATS_CA, when set, wins over it (no flag sets
	// it, so the environment comes before the file, as for every
	// setting). Defaults to none: the system's roots.
	CA string `yaml:"ca"`
	// InboxPrefix is the connection's inbox prefix. NATS_INBOX_PREFIX,
	// when set, wins over it (as NATS_CA over CA). Defaults to the prefix
	// the credential may subscribe to (its "_INBOX.<identity>.>"
	// permission), then "_INBOX.<name>".
	InboxPrefix string `yaml:"inbox_prefix"`
	// Name is the connection name shown by the server.
	Name string `yaml:"-"`
}

// EnvVars are the environment variables WithEnv reads.
var EnvVars = []string{"NATS_URL", "NATS_CREDS", "NATS_CA", "NATS_INBOX_PREFIX"}

// WithEnv applies EnvVars. URL and Creds are filled from NATS_URL and
// NATS_CREDS only when empty: a process's --server and --creds flags, which
// those variables also set, already resolved them (flag > environment >
// file). CA and InboxPrefix have no flag: NATS_CA and NATS_INBOX_PREFIX,
// when set, replace them, so the environment beats the file for them too.
func (o Options) WithEnv() Options { return o.WithEnvFrom(os.LookupEnv) }

// WithEnvFrom is WithEnv reading the environment through lookup (what a
// process with an injected environment, --print-config among them, uses).
func (o Options) WithEnvFrom(lookup func(string) (string, bool)) Options {
	get := func(k string) string { v, _ := lookup(k); return v }
	if o.URL == "" {
		o.URL = get("NATS_URL")
	}
	if o.URL == "" {
		o.URL = DefaultURL
	}
	if o.Creds == "" {
		o.Creds = get("NATS_CREDS")
	}
	if v := get("NATS_CA"); v != "" {
		o.CA = v
	}
	if v := get("NATS_INBOX_PREFIX"); v != "" {
		o.InboxPrefix = v
	}
	return o
}

// pingInterval and maxPingsOut bound how long a connection to a server
// that stopped answering lives: about pingInterval × (maxPingsOut + 1).
const (
	pingInterval = 5 * time.Second
	maxPingsOut  = 3
)

// Connect opens a connection and a JetStream context.
func Connect(o Options, log zerolog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	o = o.WithEnv()
	id, err := identify(o)
	if err != nil {
		return nil, nil, err
	}
	t := &tracker{identity: id.name, log: log}
	opts := []nats.Option{
		nats.CustomInboxPrefix(id.inbox),
		nats.ErrorHandler(t.asyncError),
		nats.ClosedHandler(func(nc *nats.Conn) { trackers.Delete(nc) }),
		nats.Name(o.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		// A server that vanished without a TCP reset (its host died, a
		// partition) is noticed in seconds, not nats.go's default of two
		// pings two minutes apart: until then the process sits on a dead
		// connection while its presence expires and its work is moved.
		nats.PingInterval(pingInterval),
		nats.MaxPingsOutstanding(maxPingsOut),
		nats.RetryOnFailedConnect(false),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn().Err(err).Msg("nats disconnected")
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("server", Redact(nc.ConnectedUrl())).Msg("nats reconnected")
		}),
	}
	if o.Creds != "" {
		opts = append(opts, nats.UserCredentials(o.Creds))
	}
	if o.CA != "" {
		opts = append(opts, nats.RootCAs(o.CA))
	}
	nc, err := nats.Connect(o.URL, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to nats at %s as %s: %w", Redact(o.URL), id.name, err)
	}
	trackers.Store(nc, t)
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// Redact hides the password of a server URL (user:pass@host) so URLs can be
// logged. An entry without a scheme is read as nats.go reads it (with
// nats://): "u:secret@h:4222" was printed as it was. One that does not
// parse is not printed at all.
func Redact(raw string) string {
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		parts[i] = redactOne(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}

func redactOne(p string) string {
	bare := !strings.Contains(p, "://")
	if bare {
		p = "nats://" + p
	}
	u, err := url.Parse(p)
	if err != nil {
		return "(unparseable url)"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			p = u.Redacted()
		} else {
			// nats://<token>@host: the user name is the secret.
			u.User = url.User("xxxxx")
			p = u.String()
		}
	}
	if bare {
		p = strings.TrimPrefix(p, "nats://")
	}
	return p
}
