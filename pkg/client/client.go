package client

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natsconn"
	"github.com/wardenhq/warden/pkg/spec"
)

// DefaultReplyTimeout is how long Submit waits for the scheduler's reply
// when Options.ReplyTimeout is zero.
const DefaultReplyTimeout = 10 * time.Second

// Options configure a Client.
type Options struct {
	// ReplyTimeout bounds how long Submit waits for the scheduler's
	// SubmitReply after the PubAck. Defaults to DefaultReplyTimeout.
	ReplyTimeout time.Duration
	// Limits are applied by the local validation. Defaults to
	// spec.DefaultLimits, the scheduler's defaults.
	Limits spec.Limits
	// Creds is a NATS credentials file, for Connect. Defaults to
	// $NATS_CREDS, then none.
	Creds string
	// Name is the connection's name in the server, for Connect. Defaults
	// to "warden-client".
	Name string
}

func (o Options) withDefaults() Options {
	if o.ReplyTimeout <= 0 {
		o.ReplyTimeout = DefaultReplyTimeout
	}
	return o
}

// Client submits and inspects jobs over one NATS connection. It is safe for
// concurrent use.
type Client struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	opts Options
	// owned is true when Connect opened the connection, so Close closes it.
	owned bool
}

// New wraps an existing JetStream context; Close leaves its connection open.
func New(js jetstream.JetStream, opts Options) *Client {
	return &Client{nc: js.Conn(), js: js, opts: opts.withDefaults()}
}

// Connect opens a connection to servers (comma-separated URLs; empty means
// $NATS_URL, then nats://127.0.0.1:4222) as the warden CLI does, with
// opts.Creds (or $NATS_CREDS); Close closes it.
func Connect(servers string, opts Options) (*Client, error) {
	conn := natsconn.Options{URL: servers, Creds: opts.Creds, Name: opts.Name}
	if conn.Name == "" {
		conn.Name = "warden-client"
	}
	_, js, err := natsconn.Connect(conn, zerolog.Nop())
	if err != nil {
		return nil, err
	}
	c := New(js, opts)
	c.owned = true
	return c, nil
}

// Close closes the connection if Connect opened it.
func (c *Client) Close() {
	if c.owned {
		c.nc.Close()
	}
}

// JetStream exposes the JetStream context, for callers that need raw access.
func (c *Client) JetStream() jetstream.JetStream { return c.js }

// store opens the job store. Binding is one cheap request; doing it per call
// keeps a Client usable against a server whose buckets appear later.
func (c *Client) store(ctx context.Context) (*jobstore.Store, error) {
	st, err := jobstore.Open(ctx, c.js)
	if err != nil {
		return nil, fmt.Errorf("job store: %w", err)
	}
	return st, nil
}
