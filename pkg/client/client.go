package client

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/jobstore"
	"github.com/wardenhq/warden/pkg/natsconn"
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

// Connect opens a connection as the warden CLI does (--server / NATS_URL,
// --creds / NATS_CREDS); Close closes it.
func Connect(conn natsconn.Options, opts Options) (*Client, error) {
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

// Conn exposes the NATS connection, for control requests.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Store opens the job store, for callers that change records (operators'
// commands such as a dead-letter retry).
func (c *Client) Store(ctx context.Context) (*jobstore.Store, error) { return c.store(ctx) }
