package chaos

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/wardenhq/warden/test/procs"
)

// Partitions. Every process of the chaos cluster reaches nats-server
// through its own proxy (procs.Proxy), so that one of them can be cut off
// from the server while it keeps running: a blackhole holds every byte both
// ways with the connections open (neither end sees a close; the client's
// pings time out after about 20 s, the server's never in the window), a cut
// closes them and refuses new ones. Both end with a heal.
//
// The schedule is drawn from the seed, from its own random stream so that
// a seed's kills and pauses are those it had before partitions existed:
//
//   - the probe (both forms, probe_test.go): an agent blackholed as soon as
//     the ledger shows it started a step of its own, kept cut off until the
//     supervisor took the step back from it (its presence and task lease
//     ran out, it was failed over), and in the full form for at least
//     8-25 s; its late success, if it reports one, must be dropped as
//     stale, and the step must succeed under another dispatch.
//   - the short form adds one agent cut of 1-2 s; the full form blackholes
//     agents (2-20 s), a scheduler (6-20 s) and the supervisor leader
//     (until the other supervisor leads, at least 6-10 s), and cuts an
//     agent and a scheduler for 1-5 s.
//
// A partitioned process is neither killed nor paused. Every partition must
// have had its effect, or the test fails: a blackhole held bytes the
// process sent, a cut closed or refused its connections, the leader's
// blackhole moved the leadership and the old leader stepped down, the
// probe's step was taken back and the agent's own dispatch did not win.

// partition is one scheduled partition of a process other than the probe.
type partition struct {
	kind   string        // its counts key: "agent blackholes", "scheduler cuts", ...
	at     time.Duration // after the start of the fault window
	minFor time.Duration // a blackhole lasts at least this, a cut this long
	maxFor time.Duration // waiting for the leadership to move, at most this
	leader bool          // the target is the supervisor leader; healed once another leads

	target        string
	proc          *procs.Proc // the target's process when it began
	outAt         int         // the length of its output then
	before, after procs.ProxyStats
	begun, healed time.Time
	moved         string // the supervisor leading at the heal (leader partitions)
}

func (p *partition) blackhole() bool { return strings.HasSuffix(p.kind, "blackholes") }

// partitioner starts and heals the partitions; only the chaos goroutine
// calls it, but the probe runs on its own.
type partitioner struct {
	c        *cluster
	start    time.Time
	rnd      *rand.Rand
	leader   func() string // the supervisor holding the lease, or ""
	planned  []*partition
	active   []*partition
	past     []*partition
	dropped  []*partition // planned, never begun: their targets were never free
	probe    *probe
	problems []string
}

func newPartitioner(c *cluster, seed int64, full bool, start time.Time, leader func() string) *partitioner {
	rnd := rand.New(rand.NewPCG(uint64(seed), 0x9a47))
	p := &partitioner{c: c, start: start, rnd: rnd, leader: leader}
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rnd.Int64N(int64(hi-lo))) }
	p.probe = newProbe(3*time.Second, 0, 60*time.Second)
	if !full {
		p.planned = []*partition{{kind: "agent cuts", at: between(18*time.Second, 22*time.Second), minFor: between(time.Second, 2*time.Second)}}
		return p
	}
	p.probe.minFor = between(8*time.Second, 25*time.Second)
	p.planned = []*partition{
		{kind: "scheduler cuts", at: between(5*time.Second, 55*time.Second), minFor: between(time.Second, 5*time.Second)},
		{kind: "scheduler blackholes", at: between(22*time.Second, 34*time.Second), minFor: between(6*time.Second, 20*time.Second)},
		{kind: "agent blackholes", at: between(26*time.Second, 40*time.Second), minFor: between(2*time.Second, 20*time.Second)},
		{kind: "agent blackholes", at: between(40*time.Second, 54*time.Second), minFor: between(2*time.Second, 12*time.Second)},
		{kind: "agent cuts", at: between(30*time.Second, 55*time.Second), minFor: between(time.Second, 5*time.Second)},
		{kind: "supervisor leader blackholes", at: between(44*time.Second, 50*time.Second), minFor: between(6*time.Second, 10*time.Second),
			maxFor: 40 * time.Second, leader: true},
	}
	return p
}

// tend heals the partitions that are over and starts those whose time
// came (agents' only once the probe has cut its agent off, so that
// nothing else partitions or heals that agent).
func (p *partitioner) tend(now time.Time, counts map[string]int) {
	p.note()
	p.heal(now)
	var later []*partition
	for _, f := range p.planned {
		if now.Sub(p.start) < f.at || !p.begin(f, now) {
			later = append(later, f)
			continue
		}
		counts[f.kind]++
		p.active = append(p.active, f)
	}
	p.planned = later
}

// begin partitions f's target, chosen now; false means not now.
func (p *partitioner) begin(f *partition, now time.Time) bool {
	var candidates []string
	switch {
	case f.leader:
		if l := p.leader(); l != "" {
			candidates = []string{l}
		}
	case strings.HasPrefix(f.kind, "agent"):
		if !p.probe.cutOff() {
			return false
		}
		candidates = []string{"agent-0", "agent-1", "agent-2", "agent-3"}
	default:
		candidates = []string{"scheduler-0", "scheduler-1"}
	}
	if len(candidates) == 0 {
		return false
	}
	first := p.rnd.IntN(len(candidates))
	for i := range candidates {
		name := candidates[(first+i)%len(candidates)]
		r := p.c.roles[name]
		if r == nil || !r.proc.Running() || !r.pausedTil.IsZero() {
			continue
		}
		before := r.proxy.Stats()
		var ok bool
		if f.blackhole() {
			ok = r.proxy.Blackhole()
		} else {
			ok = r.proxy.Cut()
		}
		if !ok {
			continue
		}
		f.target, f.proc, f.outAt, f.before, f.begun = name, r.proc, len(r.proc.Output()), before, now
		p.c.note("%s %s#%d", f, name, len(r.history)-1)
		return true
	}
	return false
}

// heal ends the active partitions that are over and checks that each had
// its effect.
func (p *partitioner) heal(now time.Time) {
	var still []*partition
	for _, f := range p.active {
		elapsed := now.Sub(f.begun)
		if f.leader {
			f.moved = p.leader()
		}
		moved := f.moved != "" && f.moved != f.target
		if elapsed < f.minFor || (f.leader && !moved && elapsed < f.maxFor) {
			still = append(still, f)
			continue
		}
		r := p.c.roles[f.target]
		r.proxy.Heal()
		p.c.note("heal %s %s", f, f.target)
		f.healed, f.after = now, r.proxy.Stats()
		p.past = append(p.past, f)
		switch {
		case f.blackhole() && f.after.HeldToServer == f.before.HeldToServer && f.after.Unsent == f.before.Unsent:
			// A connection opened into the blackhole is an effect too: the
			// process (restarted by a kill during the partition) tried to
			// reach the server and could not; its bytes wait unread, so no
			// read is counted held (seed 792486: "0 reads held, 8
			// connections opened into the blackhole").
			p.problems = append(p.problems, fmt.Sprintf("%s: %s sent nothing while blackholed: the partition was a no-op", f, f.target))
		case !f.blackhole() && f.after.Severed+f.after.Refused == f.before.Severed+f.before.Refused:
			p.problems = append(p.problems, fmt.Sprintf("%s: no connection of %s was cut or refused: the partition was a no-op", f, f.target))
		case f.leader && !moved:
			p.problems = append(p.problems, fmt.Sprintf("%s: no other supervisor took the lead while %s was blackholed (%s)", f, f.target, elapsed.Round(time.Millisecond)))
		}
	}
	p.active = still
}

// finish waits for the probe and the partitions still waiting for their
// effect (each bounded), tending the cluster meanwhile; partitions not
// begun by now are dropped (report names them).
func (p *partitioner) finish() {
	p.dropped, p.planned = p.planned, nil
	for {
		now := time.Now()
		p.c.tend(now)
		p.note()
		p.heal(now)
		if len(p.active) == 0 && p.probe.finished() {
			p.note()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// report checks what can be checked once the cluster settled and returns
// a line per partition and the problems found.
func (p *partitioner) report() (story, problems []string) {
	for _, f := range p.past {
		line := fmt.Sprintf("%s: %s at %s for %s: ", f, f.target, f.begun.Sub(p.start).Round(time.Millisecond), f.healed.Sub(f.begun).Round(time.Millisecond))
		if f.blackhole() {
			line += fmt.Sprintf("%d reads held toward the server, %d toward it, %d connections opened into the blackhole",
				f.after.HeldToServer-f.before.HeldToServer, f.after.HeldToClient-f.before.HeldToClient, f.after.Unsent-f.before.Unsent)
		} else {
			line += fmt.Sprintf("%d connections cut, %d refused", f.after.Severed-f.before.Severed, f.after.Refused-f.before.Refused)
		}
		if f.leader {
			line += "; then led by " + f.moved
			// It steps down at its first renewal in the blackhole; its
			// output is kept if it was killed since.
			if !strings.Contains(f.proc.Output()[f.outAt:], "stepping down") {
				p.problems = append(p.problems, fmt.Sprintf("%s: %s, blackholed while it led, never logged stepping down", f, f.target))
			}
		}
		story = append(story, line)
	}
	for _, f := range p.dropped {
		story = append(story, fmt.Sprintf("%s planned at %s never began: no target was running, unpaused and unpartitioned before the window closed",
			f, f.at.Round(time.Millisecond)))
	}
	return story, p.problems
}

func (p *partition) String() string { return strings.TrimSuffix(p.kind, "s") }

// sleepCtx sleeps for d, or less if ctx ends first (false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ledgerTail reads the ledger's new complete lines at each next.
type ledgerTail struct {
	path    string
	off     int64
	partial string
}

func (l *ledgerTail) next() []ledgerRun {
	f, err := os.Open(l.path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := f.Seek(l.off, io.SeekStart); err != nil {
		return nil
	}
	b, _ := io.ReadAll(f)
	l.off += int64(len(b))
	lines := strings.Split(l.partial+string(b), "\n")
	l.partial = lines[len(lines)-1]
	var out []ledgerRun
	for _, line := range lines[:len(lines)-1] {
		if fs := strings.Fields(line); len(fs) == 6 {
			out = append(out, ledgerRun{job: fs[0], step: fs[1], epoch: fs[2], agent: fs[3], pid: fs[4]})
		}
	}
	return out
}
