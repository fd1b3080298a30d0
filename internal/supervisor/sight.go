package supervisor

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// sight tracks whether the leader can trust what its presence view shows.
// "I could not see" is not "it is gone": after any gap (the connection
// dropped or reconnected; the view's watch saw a gap, a stall or a
// re-sync, see internal/watch) presence is not trusted until one presence
// TTL has passed on a fresh view, so agents that could not heartbeat while
// the server was away have re-announced themselves. Until then nobody is
// failed over and nobody's health is judged.
type sight struct {
	nc   *nats.Conn
	view settler
	ttl  time.Duration
	now  func() time.Time

	mu         sync.Mutex
	reconnects uint64
	clearAt    time.Time
}

// settler is the view's own gap tracking (presence.View, internal/watch).
type settler interface {
	// Settled is true when the view is fresh and its last gap ended at
	// least d before now.
	Settled(d time.Duration, now time.Time) bool
}

// newSight starts blind for one TTL: a leader that has just taken over
// (perhaps because the server came back and its predecessor's lease
// lapsed) has not yet seen every live agent's heartbeat.
func newSight(nc *nats.Conn, view settler, ttl time.Duration, now func() time.Time) *sight {
	return &sight{nc: nc, view: view, ttl: ttl, now: now, reconnects: nc.Stats().Reconnects, clearAt: now().Add(ttl)}
}

// gap records that the view may have missed something at now.
func (s *sight) gap(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := now.Add(s.ttl); c.After(s.clearAt) {
		s.clearAt = c
	}
}

// poll notices a lost or re-established connection.
func (s *sight) poll() {
	now := s.now()
	if s.nc.Status() != nats.CONNECTED {
		s.gap(now)
		return
	}
	if r := s.nc.Stats().Reconnects; r != s.loadReconnects() {
		s.mu.Lock()
		s.reconnects = r
		s.mu.Unlock()
		s.gap(now)
	}
}

func (s *sight) loadReconnects() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reconnects
}

// clear reports whether presence can be trusted at now, and if not, from
// when it can.
func (s *sight) clear(now time.Time) (bool, time.Time) {
	s.poll()
	s.mu.Lock()
	at := s.clearAt
	s.mu.Unlock()
	if !s.view.Settled(s.ttl, now) {
		// The view is re-syncing or settling; look again soon.
		if again := now.Add(s.ttl / 4); again.After(at) {
			at = again
		}
		return false, at
	}
	return !now.Before(at), at
}

// run polls the connection until ctx ends, so that a gap is dated close to
// when it happened.
func (s *sight) run(ctx context.Context) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.poll()
		}
	}
}
