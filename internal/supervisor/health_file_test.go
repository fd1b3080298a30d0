package supervisor_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/supervisor"
	"github.com/wardenhq/warden/streams"
)

// health_config is read once, by New. It was read again at every term: a
// file that went bad after start (a typo, a ConfigMap update) failed every
// term while the lease was still renewed, so nothing recovered and no
// standby could take over. The supervisor must lead with the file it
// started with.
func TestHealthFileChangedAfterStartDoesNotStopLeading(t *testing.T) {
	t.Parallel()
	srv, _, _ := natstest.Start(t, streams.Options{})
	file := filepath.Join(t.TempDir(), "health.yaml")
	if err := os.WriteFile(file, []byte("# the defaults\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	nc, _ := srv.Connect(t)
	v, err := supervisor.New(supervisor.Config{ID: "started-good", HealthConfig: file}, nc, testLogger(t, "supervisor"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("min_taks: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "supervisor", v.Run)
	select {
	case <-v.Leading():
	case <-time.After(20 * time.Second):
		t.Fatal("after 20s the supervisor holding the lease is not leading: its terms fail on the health file changed after start")
	}
	// A new supervisor still refuses the bad file at start.
	nc2, _ := srv.Connect(t)
	if _, err := supervisor.New(supervisor.Config{HealthConfig: file}, nc2, testLogger(t, "supervisor"), nil); err == nil {
		t.Fatal("New accepted a health file with an unknown field")
	}
}
