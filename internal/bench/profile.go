package bench

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"
)

// startProfiles profiles nats-server (through its -profile port) and this
// process for d, when Config.ProfileDir is set, writing
// <dir>/<name>-nats-server.pprof and <dir>/<name>-bench.pprof. stop ends
// this process's profile and waits for the server's. Without a profile
// directory, or with an embedded server (then this process's profile
// includes the server), only what can be taken is.
func (e *Env) startProfiles(tb *runTB, srv *natsServer, name string, d time.Duration) (stop func()) {
	dir := e.cfg.ProfileDir
	if dir == "" {
		return func() {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatalf("profile dir: %v", err)
	}
	serverDone := make(chan struct{})
	if srv.ProfilePort == 0 {
		close(serverDone)
	} else {
		go func() {
			defer close(serverDone)
			secs := max(1, int(d.Round(time.Second)/time.Second))
			url := fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", srv.ProfilePort, secs)
			resp, err := (&http.Client{Timeout: d + 30*time.Second}).Get(url)
			if err != nil {
				e.logf("nats-server profile: %v", err)
				return
			}
			defer resp.Body.Close()
			p := filepath.Join(dir, name+"-nats-server.pprof")
			f, err := os.Create(p)
			if err != nil {
				e.logf("nats-server profile: %v", err)
				return
			}
			defer f.Close()
			if _, err := io.Copy(f, resp.Body); err != nil {
				e.logf("nats-server profile: %v", err)
				return
			}
			e.logf("wrote %s (go tool pprof -top %s)", p, p)
		}()
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
		return func() { <-serverDone }
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
		e.logf("wrote %s", p)
		<-serverDone
	}
}
