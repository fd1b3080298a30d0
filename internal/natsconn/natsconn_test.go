package natsconn_test

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"gopkg.in/yaml.v3"

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

// NATS_CA and NATS_INBOX_PREFIX have no flag: the configs promise flag >
// environment > file, so when set they win over the file's nats.ca and
// nats.inbox_prefix. They only filled empty fields, so a file's value beat
// the environment.
func TestEnvironmentBeatsTheFileForCAAndInboxPrefix(t *testing.T) {
	srv := natstest.New(t)
	t.Setenv("NATS_INBOX_PREFIX", "_INBOX.from_env")
	t.Setenv("NATS_CA", "/etc/warden/env-ca.pem")
	file := natsconn.Options{URL: srv.URL, CA: "/etc/warden/file-ca.pem", InboxPrefix: "_INBOX.from_file"}
	if got := file.WithEnv(); got.CA != "/etc/warden/env-ca.pem" || got.InboxPrefix != "_INBOX.from_env" {
		t.Fatalf("WithEnv: ca %q, inbox_prefix %q; want the environment's", got.CA, got.InboxPrefix)
	}
	file.CA = "" // no TLS on the test server
	t.Setenv("NATS_CA", "")
	nc, _, err := natsconn.Connect(file, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if nc.Opts.InboxPrefix != "_INBOX.from_env" {
		t.Fatalf("connected with inbox prefix %q, want NATS_INBOX_PREFIX's", nc.Opts.InboxPrefix)
	}
	// Unset, the file's value stands.
	t.Setenv("NATS_INBOX_PREFIX", "")
	if got := file.WithEnv(); got.InboxPrefix != "_INBOX.from_file" {
		t.Fatalf("without NATS_INBOX_PREFIX: %q, want the file's", got.InboxPrefix)
	}
}

// Every configs/*.yaml writes out every default, the nats block included:
// ca and inbox_prefix were printed by --print-config but in no file.
func TestShippedConfigsWriteOutEveryNATSSetting(t *testing.T) {
	t.Parallel()
	var want []string
	typ := reflect.TypeOf(natsconn.Options{})
	for i := range typ.NumField() {
		if tag := typ.Field(i).Tag.Get("yaml"); tag != "-" {
			want = append(want, tag)
		}
	}
	for _, name := range []string{"scheduler", "supervisor", "agent", "api"} {
		b, err := os.ReadFile("../../configs/" + name + ".yaml")
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			NATS map[string]any `yaml:"nats"`
		}
		if err := yaml.Unmarshal(b, &doc); err != nil {
			t.Fatalf("configs/%s.yaml: %v", name, err)
		}
		for _, k := range want {
			if v, ok := doc.NATS[k]; !ok || v != "" {
				t.Errorf("configs/%s.yaml: nats.%s is %v (present %v), want it written out empty", name, k, v, ok)
			}
		}
	}
}

// A server list entry without a scheme (nats.go adds nats:// itself) has
// its password hidden too, and one that does not parse is not printed.
//
// Old code: "u:secret2@h2:4222" and "tok3n@h3:4222" printed as they were.
func TestRedactHidesSecretsOfEntriesWithoutAScheme(t *testing.T) {
	t.Parallel()
	got := natsconn.Redact("nats://u:p@h1:4222,u:secret2@h2:4222,tok3n@h3:4222,h4:4222,nats://u:%zz@h5")
	for _, secret := range []string{"secret2", "tok3n", "%zz"} {
		if strings.Contains(got, secret) {
			t.Fatalf("Redact printed %q: %s", secret, got)
		}
	}
	if !strings.Contains(got, "h2:4222") || !strings.Contains(got, "h4:4222") {
		t.Fatalf("Redact lost the hosts: %s", got)
	}
}
