package daemon

import (
	"context"
	"io"
	"net/http"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// Not parallel: the GC target is the process's.
func TestGCPercentYieldsToGOGC(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })

	setGCPercent(400, envOf(nil), zerolog.Nop())
	if got := debug.SetGCPercent(100); got != 400 {
		t.Fatalf("gc_percent 400 left the target at %d", got)
	}
	setGCPercent(400, envOf(map[string]string{"GOGC": "150"}), zerolog.Nop())
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("with GOGC set, gc_percent changed the target to %d", got)
	}
	setGCPercent(0, envOf(nil), zerolog.Nop())
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("gc_percent 0 changed the target to %d", got)
	}
	// An empty GOGC is not set: the runtime used its default.
	setGCPercent(400, envOf(map[string]string{"GOGC": ""}), zerolog.Nop())
	if got := debug.SetGCPercent(100); got != 400 {
		t.Fatalf("with GOGC empty, gc_percent 400 left the target at %d", got)
	}
}

func TestPprofServesProfilesButNotTheCommandLine(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	addr, err := servePprof(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/debug/pprof/heap?debug=1"); code != http.StatusOK || !strings.Contains(body, "heap profile") {
		t.Fatalf("heap profile: %d %.80q", code, body)
	}
	if code, body := get("/debug/pprof/cmdline"); code == http.StatusOK {
		t.Fatalf("cmdline served: %.80q", body)
	}
}
