package chaos

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/test/procs"
)

// scenario is the base of the single-fault scenarios: a nats-server process
// with file storage, one scheduler (with extra args) that has created the
// streams, a reconnecting connection, and a ledger path for test agents.
type scenario struct {
	c      *cluster
	ledger string
	js     jetstream.JetStream
}

func newScenario(t *testing.T, schedulerArgs ...string) *scenario {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), roles: map[string]*role{}}
	c.port = freePort(t)
	c.url = fmt.Sprintf("nats://127.0.0.1:%d", c.port)
	c.startNATS()
	procs.Start(t, "scheduler", bins["scheduler"], append([]string{"--server", c.url}, schedulerArgs...)...)
	nc, err := nats.Connect(c.url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// Agents need the streams the scheduler creates.
	waitFor(t, 30*time.Second, "the scheduler's consumers", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.Consumer(ctx, protocol.StreamSubmit, "scheduler-submit-bare")
		return err == nil
	})
	return &scenario{c: c, ledger: filepath.Join(c.dir, "ledger"), js: js}
}

// agent starts a ledger test agent.
func (s *scenario) agent(id string) *procs.Proc {
	return procs.Start(s.c.t, id, bins["testagent"], "--server", s.c.url, "--id", id, "--ledger", s.ledger)
}

// supervisor starts a supervisor.
func (s *scenario) supervisor(id string) *procs.Proc {
	return procs.Start(s.c.t, id, bins["supervisor"], "--server", s.c.url, "--id", id)
}
