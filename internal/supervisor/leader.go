package supervisor

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/anchor"
	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// leader wires one term of leadership: it builds the components, each
// owning one duty, feeds them presence changes and runs them until the
// term ends. Everything is rebuilt on takeover, so a new leader never
// trusts what an old one had in memory.
type leader struct {
	term     *term
	view     *presence.View
	sight    *sight
	recovery *recovery
	suspects *suspects
	dead     *deadLetters
	healer   *healer
	failover *failover
	transfer *transfers
	anchors  *anchor.Keeper // nil when anchor_interval is negative
	log      zerolog.Logger
	departed chan presence.Change
	gone     chan string
}

// newLeader builds the components of a term.
func (s *Supervisor) newLeader(ctx context.Context, lease leaseHolder, epoch uint64) (*leader, error) {
	log := s.log.With().Uint64("leader_epoch", epoch).Logger()
	store, err := jobstore.Open(ctx, s.js)
	if err != nil {
		return nil, err
	}
	view, err := presence.NewView(ctx, s.js, log, presence.WithTaskShards(s.cfg.TaskShards))
	if err != nil {
		return nil, err
	}
	pkv, err := s.js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", protocol.BucketPresence, err)
	}
	st, err := pkv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("presence bucket status: %w", err)
	}
	c := s.cfg
	t := &term{epoch: epoch, lease: lease, js: s.js, store: store, events: events.NewPublisher(s.js), now: s.now}
	adv := newAdvancer(s.nc, t, c.AdvanceTimeout.Std(), log.With().Str("duty", "advance").Logger())
	dead := &deadLetters{js: s.js, term: t, store: store, adv: adv, metrics: s.metrics, shards: c.TaskShards,
		retry: c.RecoveryRetry.Std(), log: log.With().Str("duty", "dead_letters").Logger()}
	rel := &releaser{term: t, store: store, dead: dead, metrics: s.metrics, poison: c.PoisonThreshold,
		log: log.With().Str("duty", "release").Logger()}
	fo := &failover{js: s.js, term: t, store: store, release: rel, adv: adv, metrics: s.metrics, shards: c.TaskShards,
		log: log.With().Str("duty", "failover").Logger()}
	fo.transfers = newTransfers(t, s.js, store, rel, dead, adv, s.metrics, c.TaskShards, c.RecoveryRetry.Std(),
		log.With().Str("duty", "transfers").Logger())
	l := &leader{term: t, view: view, sight: newSight(s.nc, view, st.TTL(), s.now), failover: fo, transfer: fo.transfers, dead: dead, log: log,
		departed: make(chan presence.Change, 1024), gone: make(chan string, 1024)}
	l.recovery = &recovery{term: t, store: store, release: rel, adv: adv, grace: c.RecoveryGrace.Std(), retry: c.RecoveryRetry.Std(),
		log: log.With().Str("duty", "recovery").Logger(), built: make(chan struct{})}
	l.suspects = &suspects{f: fo, view: view, presence: pkv, sight: l.sight, threshold: c.FailureThreshold.Std(),
		retry: c.RecoveryRetry.Std(), log: log.With().Str("duty", "suspects").Logger()}
	l.healer = &healer{term: t, ops: ops.New(s.nc, store), failover: fo, selfHealing: c.SelfHealing,
		drainTimeout: c.DrainTimeout.Std(), cycle: c.CycleInterval.Std(), log: log.With().Str("duty", "healing").Logger(),
		care: map[string]*agentCare{}}
	if l.healer.assessor, err = newAssessor(ctx, t, s.health, view, l.sight, l.healer.log); err != nil {
		return nil, err
	}
	if every := c.AnchorInterval.Std(); every > 0 {
		names, err := streams.Anchored(c.streamOptions())
		if err != nil {
			return nil, err
		}
		l.anchors = anchor.New(s.js, names, every, log.With().Str("duty", "anchors").Logger())
	}
	view.OnChange(l.route)
	return l, nil
}

// route hands a presence change to the components that need it.
func (l *leader) route(c presence.Change) {
	if !c.Gone {
		// Into the tracker (safe for concurrent use) at once, stamped
		// with its arrival: a heartbeat that waited for the healer was as
		// old as the healer's cycle, and a slow cycle made every agent
		// look silent.
		l.healer.assessor.heartbeat(c.Presence, l.term.now())
		return
	}
	l.healer.assessor.left(c.Key) // in order with its heartbeats
	select {
	case l.gone <- c.Key:
	default: // its record ages out of warden_health
	}
	select {
	case l.departed <- c:
	default:
		// Not lost: the orphan scan of the next term, or the step's
		// lease, still finds its tasks. Say so loudly.
		l.log.Error().Str("agent", c.Key).Msg("agent departure dropped: failover queue full; its tasks wait for their lease")
	}
}

// leadTerm runs the leader's components for one term.
func (s *Supervisor) leadTerm(ctx context.Context, lease leaseHolder, epoch uint64) error {
	l, err := s.newLeader(ctx, lease, epoch)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	g := &group{errc: make(chan error, 8)}
	defer func() {
		cancel()
		g.wg.Wait()
	}()
	g.run(ctx, "presence", l.view.Run)
	select {
	case <-l.view.Ready():
	case <-ctx.Done():
		return nil
	case err := <-g.errc:
		return err
	}
	g.run(ctx, "sight", l.sight.run)
	g.run(ctx, "recovery", l.recovery.run)
	g.run(ctx, "failover", func(ctx context.Context) error { return l.suspects.run(ctx, l.departed) })
	g.run(ctx, "dead letters", l.dead.run)
	g.run(ctx, "transfers", l.transfer.run)
	g.run(ctx, "health", func(ctx context.Context) error { return l.healer.run(ctx, l.gone) })
	if l.anchors != nil {
		g.run(ctx, "anchors", l.anchors.Run)
	}
	ctrl, err := s.nc.Subscribe(protocol.SubjectControlFailover, func(m *nats.Msg) { l.manualFailover(ctx, m) })
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", protocol.SubjectControlFailover, err)
	}
	defer func() { _ = ctrl.Unsubscribe() }()
	s.metrics.leader.Set(1)
	defer s.metrics.leader.Set(0)
	select {
	case <-l.recovery.built:
		s.leadingOnce.Do(func() { close(s.leading) })
		l.log.Info().Msg("leading: lease recovery, agent failover and dead letters active")
	case <-ctx.Done():
		return nil
	case err := <-g.errc:
		return err
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-g.errc:
		return err
	}
}

// group runs a term's loops; the first error ends the term.
type group struct {
	wg   sync.WaitGroup
	errc chan error
}

func (g *group) run(ctx context.Context, name string, f func(context.Context) error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := f(ctx); err != nil && ctx.Err() == nil {
			g.errc <- fmt.Errorf("%s: %w", name, err)
		}
	}()
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// manualFailover serves `warden agent failover`: the agent's queue moves now,
// whether or not its presence is gone.
func (l *leader) manualFailover(ctx context.Context, m *nats.Msg) {
	if !protocol.ValidReplySubject(m.Reply) {
		// An operator's failover is a request (the CLI, the API): one
		// without an inbox to answer is not theirs. A consumer's delivery
		// (reply $JS.ACK.…) can carry what an agent wrote to a key it may
		// write, to any subject (nats-io/nats-server#8274); and answered
		// there, the reply, which the response permission lets through,
		// would be a write to that subject.
		l.log.Warn().Str("reply", m.Reply).Msg("failover request without an inbox to answer: dropped")
		return
	}
	key := string(m.Data)
	pool, agent, ok := strings.Cut(key, ".")
	if !ok || !protocol.ValidToken(pool) || !protocol.ValidToken(agent) {
		_ = m.Respond(protocol.ErrorReply(protocol.CodeInvalidRequest, fmt.Errorf("expected <pool>.<agent>, got %q", key)))
		return
	}
	l.log.Warn().Str("agent", key).Msg("failover requested by an operator")
	move := l.failover.transferLive
	if present, err := l.suspects.present(ctx, pool, agent); err == nil && !present {
		// Gone already: as a departure, its tasks in hand are suspects.
		// Present, or not seen, they are not: a step must not be
		// dead-lettered as poison for being moved off live agents.
		move = l.failover.transfer
	}
	rec, err := move(ctx, pool, agent, "operator:"+nuid.Next())
	if err != nil {
		_ = m.Respond(protocol.ErrorReply(protocol.CodeFailed, err))
		return
	}
	_ = m.Respond(protocol.OKReply(fmt.Sprintf("failover %s: %d tasks moved to %v, %d waiting (%s)", rec.ID, rec.TasksMoved, rec.Targets, rec.Waiting, rec.Outcome)))
}
