package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/lease"
	"github.com/wardenhq/warden/test/procs"
)

// role is one process slot of the cluster: what runs there now, whether it
// should be running, and when a paused or killed one comes back. Every
// process of the slot reaches nats-server through the slot's proxy, which
// partitions it (partition_test.go).
type role struct {
	name      string
	proxy     *procs.Proxy
	start     func() *procs.Proc
	proc      *procs.Proc
	history   []*procs.Proc // every process that ran in this slot
	downUntil time.Time     // killed by chaos: restart at this time
	pausedTil time.Time     // SIGSTOPped: SIGCONT at this time
	restarts  int
}

// cluster owns every process. Only the chaos goroutine (or the test before
// and after it) touches it.
type cluster struct {
	t      *testing.T
	dir    string
	url    string
	port   int
	ledger string
	nats   *procs.Proc
	roles  map[string]*role
	order  []string
	faults []string // what chaos did, when (keeplogs_test.go)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, dir: t.TempDir(), roles: map[string]*role{}}
	c.port = freePort(t)
	c.url = fmt.Sprintf("nats://127.0.0.1:%d", c.port)
	c.ledger = filepath.Join(c.dir, "ledger")
	c.startNATS()
	// The proxies start before the processes, so that their cleanups run
	// after the processes are killed.
	add := func(name string, start func(url string) *procs.Proc) {
		px := procs.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", c.port))
		url := "nats://" + px.Addr()
		c.roles[name] = &role{name: name, proxy: px, start: func() *procs.Proc { return start(url) }}
		c.order = append(c.order, name)
	}
	for i := range 2 {
		add(fmt.Sprintf("scheduler-%d", i), func(url string) *procs.Proc {
			return procs.Start(t, fmt.Sprintf("scheduler-%d", i), bins["scheduler"], logLevelArgs("WARDEN_CHAOS_SCHEDULER_LOG_LEVEL", "--server", url)...)
		})
	}
	for i := range 2 {
		id := fmt.Sprintf("sup-%d", i)
		add(id, func(url string) *procs.Proc {
			return procs.Start(t, id, bins["supervisor"], logLevelArgs("WARDEN_CHAOS_SUPERVISOR_LOG_LEVEL", "--server", url, "--id", id)...)
		})
	}
	for i := range 4 {
		id := fmt.Sprintf("agent-%d", i)
		add(id, func(url string) *procs.Proc {
			return procs.Start(t, id, bins["testagent"], "--server", url, "--id", id, "--ledger", c.ledger, "--cluster", chaosCluster)
		})
	}
	for _, name := range c.order {
		r := c.roles[name]
		r.proc = r.start()
		r.history = append(r.history, r.proc)
	}
	return c
}

func (c *cluster) startNATS() {
	c.nats = procs.Start(c.t, "nats-server", bins["nats-server"], "-js", "-sd", filepath.Join(c.dir, "jetstream"),
		"-a", "127.0.0.1", "-p", strconv.Itoa(c.port), "-n", "chaos")
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", c.port))
		if err == nil {
			conn.Close()
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("nats-server did not listen: %s", c.nats.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// restartNATS stops the server — gracefully, or with SIGKILL when kill is
// set — and starts it on the same port and store; every process reconnects
// by itself.
func (c *cluster) restartNATS(kill bool) {
	if kill {
		c.nats.Kill()
		c.startNATS()
		return
	}
	_ = c.nats.Signal(syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if _, err := c.nats.Wait(ctx); err != nil {
		c.nats.Kill()
	}
	c.startNATS()
}

// tend restarts what chaos killed once its downtime is over, restarts what
// died by itself (an agent killed by a poison task) at once, and resumes
// paused processes when their pause is over.
func (c *cluster) tend(now time.Time) {
	for _, name := range c.order {
		r := c.roles[name]
		if !r.pausedTil.IsZero() && !now.Before(r.pausedTil) {
			_ = r.proc.Signal(syscall.SIGCONT)
			r.pausedTil = time.Time{}
		}
		if !r.proc.Running() && !now.Before(r.downUntil) {
			r.proc = r.start()
			r.history = append(r.history, r.proc)
			r.restarts++
		}
	}
}

// kill sends SIGKILL and keeps the role down for d. A partitioned process
// is left alone: what a partition checks needs it alive when it heals.
func (c *cluster) kill(name string, now time.Time, d time.Duration) bool {
	r := c.roles[name]
	if !r.proc.Running() || !r.pausedTil.IsZero() || r.proxy.Partitioned() {
		return false
	}
	r.proc.Kill()
	r.downUntil = now.Add(d)
	c.note("kill %s#%d for %s", name, len(r.history)-1, d)
	return true
}

// pause sends SIGSTOP for d; a partitioned process is left alone.
func (c *cluster) pause(name string, now time.Time, d time.Duration) bool {
	r := c.roles[name]
	if !r.proc.Running() || !r.pausedTil.IsZero() || r.proxy.Partitioned() {
		return false
	}
	if err := r.proc.Signal(syscall.SIGSTOP); err != nil {
		return false
	}
	r.pausedTil = now.Add(d)
	c.note("pause %s#%d for %s", name, len(r.history)-1, d)
	return true
}

// settle resumes everything and restarts whatever is down.
func (c *cluster) settle() {
	for _, r := range c.roles {
		r.downUntil = time.Time{}
		if !r.pausedTil.IsZero() {
			r.pausedTil = time.Unix(0, 0)
		}
	}
	c.tend(time.Now())
}

// supervisorLeader names the supervisor holding the lease, or "".
func (c *cluster) supervisorLeader(kvGet func(key string) ([]byte, error)) string {
	b, err := kvGet("supervisor")
	if err != nil {
		return ""
	}
	var h lease.Holder
	if json.Unmarshal(b, &h) != nil {
		return ""
	}
	if _, ok := c.roles[h.ID]; ok {
		return h.ID
	}
	return ""
}

// liveLeader names the supervisor whose running process holds the lease,
// or "": unlike supervisorLeader, not one whose holder was killed and whose
// lease has not expired yet (its slot then runs a standby).
func (c *cluster) liveLeader(kvGet func(key string) ([]byte, error)) string {
	b, err := kvGet("supervisor")
	if err != nil {
		return ""
	}
	var h lease.Holder
	if json.Unmarshal(b, &h) != nil {
		return ""
	}
	if r, ok := c.roles[h.ID]; ok && r.proc.Running() && r.proc.PID() == h.PID {
		return h.ID
	}
	return ""
}
