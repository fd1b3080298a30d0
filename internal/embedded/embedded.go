package embedded

import (
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configure the embedded server.
type Options struct {
	// Host to listen on. Defaults to 127.0.0.1.
	Host string
	// Port to listen on; -1 picks a free port. Defaults to 4222.
	Port int
	// StoreDir holds JetStream data. Required.
	StoreDir string
	// ServerName names the server in logs and advisories. Defaults to "warden-dev".
	ServerName string
	// Logs sends the server's own log lines to stderr.
	Logs bool
	// MaxPayload is the largest message the server takes. Defaults to the
	// server's (1 MiB).
	MaxPayload int32
}

// Start starts the server and waits until it accepts connections.
func Start(o Options) (*server.Server, error) {
	if o.StoreDir == "" {
		return nil, fmt.Errorf("embedded nats: store dir is required")
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.Port == 0 {
		o.Port = 4222
	}
	if o.ServerName == "" {
		o.ServerName = "warden-dev"
	}
	srv, err := server.NewServer(&server.Options{
		ServerName: o.ServerName,
		Host:       o.Host,
		Port:       o.Port,
		JetStream:  true,
		StoreDir:   o.StoreDir,
		NoSigs:     true,
		MaxPayload: o.MaxPayload,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if o.Logs {
		srv.ConfigureLogger()
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded nats: not ready after 10s (is port %d in use?)", o.Port)
	}
	return srv, nil
}
