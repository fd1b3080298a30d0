package natsconn_test

import (
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/natsconn"
	"github.com/wardenhq/warden/internal/natstest"
)

// A server that stops answering without a TCP reset (its host died) must
// be given up in seconds: nats.go's defaults (two pings two minutes apart)
// left a process on a dead connection for four to six minutes.
func TestADeadServerIsNoticedInSeconds(t *testing.T) {
	t.Parallel()
	srv := natstest.New(t)
	nc, _, err := natsconn.Connect(natsconn.Options{URL: srv.URL, Name: "ping-test"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if d := nc.Opts.PingInterval * time.Duration(nc.Opts.MaxPingsOut+1); d > 20*time.Second {
		t.Fatalf("a silent server is noticed after about %s (ping every %s, %d outstanding)", d, nc.Opts.PingInterval, nc.Opts.MaxPingsOut)
	}
}

func TestRedactHidesPasswordsAndTokens(t *testing.T) {
	t.Parallel()
	got := natsconn.Redact("nats://u:hunter2@a:4222, nats://tok3n@b:4222,nats://c:4222")
	if strings.Contains(got, "hunter2") || strings.Contains(got, "tok3n") || !strings.Contains(got, "c:4222") {
		t.Fatalf("Redact: %s", got)
	}
}
