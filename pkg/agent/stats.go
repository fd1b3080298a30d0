package agent

import (
	"math"
	"sync/atomic"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Stats are the agent's counters since start.
type Stats struct {
	// InFlight are the deliveries this agent holds, from their arrival
	// until they are settled and their handler, if one started, returned.
	InFlight int `json:"in_flight"`
	// Abandoned are the handlers that ignored cancellation, were reported
	// (or dropped) without after a grace, and still run: each holds its
	// slot, and counts in InFlight, until it returns.
	Abandoned  int    `json:"abandoned"`
	Succeeded  uint64 `json:"succeeded"`   // results reported as succeeded
	Failed     uint64 `json:"failed"`      // results reported as failed (cluster refusals are not: see ClusterFenced)
	LeaseLost  uint64 `json:"lease_lost"`  // tasks abandoned because the lease was not confirmed
	Rejected   uint64 `json:"rejected"`    // task messages that could not be decoded (terminated)
	Expired    uint64 `json:"expired"`     // tasks not run or not reported because their deadline passed
	HandedBack uint64 `json:"handed_back"` // tasks handed back (Nak) at shutdown
	// ReportedAgain are deliveries of a task whose result this agent had
	// already stored: acked unrun, the result published again (recent.go).
	ReportedAgain uint64 `json:"reported_again"`
}

type counters struct {
	inFlight      atomic.Int64
	abandoned     atomic.Int64
	succeeded     atomic.Uint64
	failed        atomic.Uint64
	leaseLost     atomic.Uint64
	rejected      atomic.Uint64
	expired       atomic.Uint64
	handedBack    atomic.Uint64
	reportedAgain atomic.Uint64
	// queueDepth is the pending count of the last task fetched (0 after a
	// pull that found nothing): the tasks still waiting on the consumer.
	// Held back (no pulls), the consumer's info refreshes it (depth.go).
	queueDepth atomic.Int64
	// health is the self-reported health's float64 bits plus one, so that
	// the zero value means "not set" (reported as 1).
	health atomic.Uint64
}

// ReportHealth sets the health this agent reports of itself in its
// heartbeats, 0..1 (1: well, the default). A handler or a check of the
// agent's own dependencies lowers it; the supervisor's assessment weighs it
// with what it observes (internal/health, self_reported).
func (a *Agent) ReportHealth(v float64) {
	if v != v { // NaN
		v = 0
	}
	a.stats.health.Store(math.Float64bits(min(max(v, 0), 1)) + 1)
}

func (a *Agent) selfHealth() *float64 {
	v := 1.0
	if b := a.stats.health.Load(); b != 0 {
		v = math.Float64frombits(b - 1)
	}
	return &v
}

// Stats returns a snapshot of the counters.
func (a *Agent) Stats() Stats {
	c := &a.stats
	return Stats{
		InFlight:      int(c.inFlight.Load()),
		Abandoned:     int(c.abandoned.Load()),
		Succeeded:     c.succeeded.Load(),
		Failed:        c.failed.Load(),
		LeaseLost:     c.leaseLost.Load(),
		Rejected:      c.rejected.Load(),
		Expired:       c.expired.Load(),
		HandedBack:    c.handedBack.Load(),
		ReportedAgain: c.reportedAgain.Load(),
	}
}

// presence is the value of the next heartbeat.
//
// limitNote: MaxConcurrent is the slots the agent runs now, max_concurrent
// or fewer after a limit order (the healer's reduce_load). Reporting the
// configured number left selection counting slots the agent would not
// use, so a limited agent kept a full share of tasks queued behind it.
func (a *Agent) presence() protocol.Presence {
	s := a.Stats()
	p := protocol.Presence{
		ID:            a.cfg.ID,
		Pool:          a.cfg.Pool,
		Capabilities:  a.cfg.Capabilities,
		Actions:       a.allowedNames,
		Labels:        a.cfg.Labels,
		MaxConcurrent: int(a.limit.Load()), // the slots it runs now (limitNote)
		InFlight:      s.InFlight,
		Succeeded:     s.Succeeded,
		Failed:        s.Failed,
		Version:       Version,
		Host:          a.host,
		PID:           pid,
		Draining:      a.draining.Load() || a.held.Load(),
		TaskStream:    protocol.TaskStream(a.shard),
		TaskSubject:   protocol.TaskSubject(a.shard, a.cfg.Pool, a.cfg.ID),
		StartedAt:     a.startedAt,
		Cluster:       a.cfg.Cluster,
		Consumer:      a.cfg.ID,
		QueueDepth:    int(a.stats.queueDepth.Load()),
		Health:        a.selfHealth(),
		// HeartbeatInterval and Utilisation are filled by the Announcer.
	}
	if a.hooks != nil && a.hooks.Presence != nil {
		a.hooks.Presence(&p)
	}
	return p
}
