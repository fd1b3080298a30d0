package health

import (
	"sort"
	"sync"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Tracker keeps, per agent (key protocol.PresenceKey), what its heartbeats
// said over the last Config.Window and derives its Observation. It reads no
// clock: every call that depends on time takes now. Safe for concurrent use.
//
// Counters in a heartbeat are cumulative since the agent started; the
// tracker counts their increase between heartbeats, so what an agent did
// before the tracker first saw it is not counted. A heartbeat with a new
// started_at or smaller counters is a restart: its counters are all new.
//
// Consecutive failures are estimated from the counters: an interval with
// failures and no success adds its failures; an interval with a success
// starts again from zero (the success may have come last). The estimate is
// never above the truth, so the consecutive-failures threshold never fires
// wrongly; the failure-rate threshold covers agents that mix successes in.
// The tracker also keeps when the streak's latest failure was recorded, so
// that the Assessor can tell a streak still growing from one that stopped
// a window ago (Observation.LastFailure).
type Tracker struct {
	assessor *Assessor
	mu       sync.Mutex
	agents   map[string]*tracked
}

type tracked struct {
	last         protocol.Presence
	lastReceived time.Time
	samples      []sample // oldest first
	consecutive  int
	lastFailure  time.Time // when the streak's latest failure was recorded; zero: no streak
	queueDepth   int
	selfReported *float64
	utilisation  *float64
	interval     time.Duration // the agent's heartbeat interval; 0: unknown
}

// sample is what one heartbeat added.
type sample struct {
	at                time.Time // when it was received
	gap               time.Duration
	succeeded, failed int
}

// NewTracker validates cfg and returns an empty tracker.
func NewTracker(cfg Config) (*Tracker, error) {
	a, err := NewAssessor(cfg)
	if err != nil {
		return nil, err
	}
	return &Tracker{assessor: a, agents: map[string]*tracked{}}, nil
}

// Assessor returns the tracker's assessor.
func (t *Tracker) Assessor() *Assessor { return t.assessor }

// Heartbeat records p, received at now. Pass the time it arrived, taken
// where it was received: a heartbeat that waited for a busy reader and is
// stamped when read looks as old as the wait, and an agent whose heartbeats
// all waited looks silent.
//
// The same heartbeat seen again (a re-sync of the presence view) is
// ignored. One stamped earlier than the last is taken as the agent's clock
// stepping back, not as a stale one: the presence watch delivers an
// agent's records in the order they were written, so an earlier stamp is
// a later heartbeat. Ignoring it judged a live agent silent until its
// clock passed the old stamp again, and failed it over. Its gap is not
// known and not counted.
func (t *Tracker) Heartbeat(p protocol.Presence, now time.Time) {
	key := protocol.PresenceKey(p.Pool, p.ID)
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.agents[key]
	if !ok {
		t.track(key, p, now)
		return
	}
	sameProcess := p.StartedAt.Equal(a.last.StartedAt)
	if p.HeartbeatAt.Equal(a.last.HeartbeatAt) ||
		(sameProcess && (p.Succeeded < a.last.Succeeded || p.Failed < a.last.Failed)) {
		// The same heartbeat again, or an older one of the same process
		// (its counters never go down): a snapshot of the view read
		// before a newer heartbeat arrived (the leader's seed). Taken
		// for a restart, it counted the agent's lifetime totals in the
		// window and could judge a long-lived agent critical.
		return
	}
	a.reported(&p)
	s := sample{at: now, gap: max(p.HeartbeatAt.Sub(a.last.HeartbeatAt), 0)}
	restarted := !sameProcess
	if restarted {
		s.succeeded, s.failed = int(p.Succeeded), int(p.Failed)
		a.consecutive, a.lastFailure = 0, time.Time{}
	} else {
		s.succeeded, s.failed = int(p.Succeeded-a.last.Succeeded), int(p.Failed-a.last.Failed)
	}
	switch {
	case s.succeeded > 0:
		a.consecutive, a.lastFailure = 0, time.Time{}
	case s.failed > 0:
		a.consecutive += s.failed
		a.lastFailure = now
	}
	a.samples = append(a.samples, s)
	a.last, a.lastReceived = p, now
	t.prune(a, now)
}

// Seed starts tracking the agent of p, received at now, unless it is
// tracked already: a snapshot of the presence view (a new leader's) can be
// older than a heartbeat the watch brought meanwhile, and taken for a
// restart it counted the agent's lifetime totals in the window.
func (t *Tracker) Seed(p protocol.Presence, now time.Time) {
	key := protocol.PresenceKey(p.Pool, p.ID)
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.agents[key]; !ok {
		t.track(key, p, now)
	}
}

// track adds the agent of p. Lock held.
func (t *Tracker) track(key string, p protocol.Presence, now time.Time) {
	a := &tracked{last: p, lastReceived: now}
	a.reported(&p)
	t.agents[key] = a
}

// reported takes what the heartbeat says of the agent beyond its counters:
// queue depth, self-reported health, utilisation and heartbeat interval.
// A field the agent does not send keeps what SetQueueDepth or SetReported
// recorded.
func (a *tracked) reported(p *protocol.Presence) {
	if p.QueueDepth > 0 || p.HeartbeatInterval > 0 {
		// An agent that sends its interval sends its queue depth too
		// (omitted when 0).
		a.queueDepth = p.QueueDepth
	}
	if p.Health != nil {
		a.selfReported = p.Health
	}
	if p.Utilisation != nil {
		a.utilisation = p.Utilisation
	}
	if p.HeartbeatInterval > 0 {
		a.interval = p.HeartbeatInterval.Std()
	}
}

// SetQueueDepth records the number of tasks waiting for the agent, as
// measured by the caller (e.g. its consumer's pending count). Heartbeats
// that carry queue_depth replace it.
func (t *Tracker) SetQueueDepth(key string, depth int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a, ok := t.agents[key]; ok {
		a.queueDepth = depth
	}
}

// SetReported records what the agent says of itself: its health and its
// resource utilisation, each 0..1 or nil when not reported. Heartbeats that
// carry them (protocol.Presence.Health, Utilisation) replace them.
func (t *Tracker) SetReported(key string, selfReported, utilisation *float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a, ok := t.agents[key]; ok {
		a.selfReported, a.utilisation = selfReported, utilisation
	}
}

// Forget drops an agent that left.
func (t *Tracker) Forget(key string) {
	t.mu.Lock()
	delete(t.agents, key)
	t.mu.Unlock()
}

// Keys returns the tracked agents' keys, sorted.
func (t *Tracker) Keys() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.agents))
	for k := range t.agents {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Observation returns what is known of the agent at now, over the window
// (now − window, now]; false when the agent is not tracked.
func (t *Tracker) Observation(key string, now time.Time) (Observation, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.agents[key]
	if !ok {
		return Observation{}, false
	}
	return t.observe(a, now), true
}

// Assess returns the agent's assessment at now; false when not tracked.
func (t *Tracker) Assess(key string, now time.Time) (Assessment, bool) {
	o, ok := t.Observation(key, now)
	if !ok {
		return Assessment{}, false
	}
	return t.assessor.Assess(o), true
}

// AssessAll returns every tracked agent's assessment at now, by key.
func (t *Tracker) AssessAll(now time.Time) map[string]Assessment {
	out := map[string]Assessment{}
	for _, k := range t.Keys() {
		if as, ok := t.Assess(k, now); ok {
			out[k] = as
		}
	}
	return out
}

func (t *Tracker) observe(a *tracked, now time.Time) Observation {
	o := Observation{
		Now:                 now,
		LastHeartbeat:       a.lastReceived,
		ExpectedInterval:    a.interval,
		ConsecutiveFailures: a.consecutive,
		LastFailure:         a.lastFailure,
		InFlight:            a.last.InFlight,
		MaxConcurrent:       a.last.MaxConcurrent,
		QueueDepth:          a.queueDepth,
		SelfReported:        a.selfReported,
		Utilisation:         a.utilisation,
	}
	from := now.Add(-t.assessor.cfg.Window.Std())
	for _, s := range a.samples {
		if !s.at.After(from) || s.at.After(now) {
			continue
		}
		if s.gap > 0 {
			o.HeartbeatGaps = append(o.HeartbeatGaps, s.gap)
		}
		o.Succeeded += s.succeeded
		o.Failed += s.failed
	}
	return o
}

// prune drops samples older than the window.
func (t *Tracker) prune(a *tracked, now time.Time) {
	from := now.Add(-t.assessor.cfg.Window.Std())
	i := 0
	for i < len(a.samples) && !a.samples[i].at.After(from) {
		i++
	}
	if i > 0 {
		a.samples = append(a.samples[:0], a.samples[i:]...)
	}
}
