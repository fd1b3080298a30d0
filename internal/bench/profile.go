package bench

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/wardenhq/warden/test/procs"
)

// remoteProfile is another process that serves net/http/pprof: name is the
// profile file's suffix, addr its host:port (empty: not profiled).
type remoteProfile struct {
	name, addr string
}

// pprofRE reads the address a Warden process serves pprof on from its
// "serving pprof" log line.
var pprofRE = regexp.MustCompile(`"addr":"http://([^"/]+)/debug/pprof/"[^\n]*serving pprof`)

// profileOf is p's pprof target, when it logged one (it does when started
// with pprof_addr, which the bench sets only with a profile directory).
func profileOf(name string, p *procs.Proc) remoteProfile {
	if m := pprofRE.FindStringSubmatch(p.Output()); m != nil {
		return remoteProfile{name: name, addr: m[1]}
	}
	return remoteProfile{name: name}
}

// startProfiles profiles nats-server (through its -profile port), this
// process, and every other process given, for d, when Config.ProfileDir is
// set, writing <dir>/<name>-nats-server.pprof, <dir>/<name>-bench.pprof and
// <dir>/<name>-<other>.pprof. stop ends this process's profile and waits
// for the others; tb's cleanup calls it too, so a window that fails still
// stops its profile. Without a profile directory, or with an embedded server
// (then this process's profile includes the server), only what can be
// taken is.
func (e *Env) startProfiles(tb *runTB, srv *natsServer, name string, d time.Duration, others ...remoteProfile) (stop func()) {
	dir := e.cfg.ProfileDir
	if dir == "" {
		return func() {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatalf("profile dir: %v", err)
	}
	if srv.ProfilePort != 0 {
		others = append(others, remoteProfile{name: "nats-server", addr: fmt.Sprintf("127.0.0.1:%d", srv.ProfilePort)})
	}
	var remote sync.WaitGroup
	for _, o := range others {
		if o.addr == "" {
			e.logf("%s profile not taken: the process logged no pprof address", o.name)
			continue
		}
		remote.Go(func() { e.fetchProfile(filepath.Join(dir, name+"-"+o.name+".pprof"), o.addr, d) })
	}
	p := filepath.Join(dir, name+"-bench.pprof")
	f, err := os.Create(p)
	if err != nil {
		tb.Fatalf("profile: %v", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		// --cpuprofile already profiles this process.
		e.logf("bench profile not taken: %v", err)
		_ = f.Close()
		_ = os.Remove(p)
		return remote.Wait
	}
	// Stopped once, by the caller at the window's end or, if a Fatalf
	// ends the window first, by tb's cleanup: a profile left running would
	// keep every later window of the run from taking its own.
	var once sync.Once
	stop = func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			_ = f.Close()
			e.logf("wrote %s", p)
			remote.Wait()
		})
	}
	tb.Cleanup(stop)
	return stop
}

// fetchProfile writes a CPU profile of d taken from the pprof server at
// addr to path; failures are logged, not fatal (a profile is a diagnostic).
func (e *Env) fetchProfile(path, addr string, d time.Duration) {
	secs := max(1, int(d.Round(time.Second)/time.Second))
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, secs)
	resp, err := (&http.Client{Timeout: d + 30*time.Second}).Get(url)
	if err != nil {
		e.logf("profile %s: %v", path, err)
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		e.logf("profile %s: %v", path, err)
		return
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err != nil {
		e.logf("profile %s: %v", path, err)
		return
	}
	e.logf("wrote %s (go tool pprof -top %s)", path, path)
}
