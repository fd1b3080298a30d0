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
	for _, c := range []struct {
		name    string
		percent int
		env     map[string]string
		want    int // the target after, from 100 before
	}{
		{"gc_percent 400", 400, nil, 400},
		{"GOGC set wins", 400, map[string]string{"GOGC": "150"}, 100},
		{"gc_percent 0 leaves the default", 0, nil, 100},
		{"an empty GOGC is not set", 400, map[string]string{"GOGC": ""}, 400},
	} {
		debug.SetGCPercent(100)
		setGCPercent(c.percent, envOf(c.env), zerolog.Nop())
		if got := debug.SetGCPercent(100); got != c.want {
			t.Errorf("%s: the target is %d, want %d", c.name, got, c.want)
		}
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
