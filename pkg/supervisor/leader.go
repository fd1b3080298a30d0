package supervisor

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/dispatch"
	"github.com/wardenhq/warden/pkg/events"
	"github.com/wardenhq/warden/pkg/jobstore"
	"github.com/wardenhq/warden/pkg/lease"
	"github.com/wardenhq/warden/pkg/presence"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/selection"
)

// leader is the state of one term of leadership. Everything is rebuilt on
// takeover, so a new leader never trusts what an old one had in memory.
type leader struct {
	*Supervisor
	epoch    uint64
	elector  *lease.Elector
	store    *jobstore.Store
	view     *presence.View
	dispatch *dispatch.Dispatcher
	events   *events.Publisher
	log      zerolog.Logger
}

// fence returns errNotLeader unless this term still holds the lease.
func (l *leader) fence() error {
	epoch, ok := l.elector.Leader()
	if !ok || epoch != l.epoch {
		return errNotLeader
	}
	return nil
}

// leadTerm runs the leader's loops for one term.
func (s *Supervisor) leadTerm(ctx context.Context, el *lease.Elector, epoch uint64) error {
	log := s.log.With().Uint64("leader_epoch", epoch).Logger()
	store, err := jobstore.Open(ctx, s.js)
	if err != nil {
		return err
	}
	view, err := presence.NewView(ctx, s.js, log)
	if err != nil {
		return err
	}
	sel := selection.New()
	l := &leader{Supervisor: s, epoch: epoch, elector: el, store: store, view: view, events: events.NewPublisher(s.js), log: log}
	l.dispatch = dispatch.New(dispatch.Config{
		TaskShards:    s.cfg.TaskShards,
		DispatchGrace: s.cfg.DispatchGrace.Std(),
	}, s.js, store, view, sel, log, nil, s.now)
	failures := make(chan presence.Change, 1024)
	beats := make(chan protocol.Presence, 4096)
	gone := make(chan string, 1024)
	view.OnChange(func(c presence.Change) {
		if c.Gone {
			select {
			case gone <- c.Key:
			default:
			}
		} else {
			select {
			case beats <- c.Presence:
			default: // a missed heartbeat only thins the regularity sample
			}
		}
		if c.Gone {
			sel.Forget(c.Presence)
		} else {
			sel.Observe(c.Presence)
		}
		if !c.Gone {
			// Heartbeats are not failover news (5,000 agents send 5,000 a
			// second); a suspect's return is read from the view when its
			// threshold ends.
			return
		}
		select {
		case failures <- c:
		default:
			// Not lost: the orphan scan of the next term, or the step's
			// lease, still finds its tasks. Say so loudly.
			log.Error().Str("agent", c.Key).Msg("agent departure dropped: failover queue full; its tasks wait for their lease")
		}
	})

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	run := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	run("presence", view.Run)
	select {
	case <-view.Ready():
	case <-ctx.Done():
		wg.Wait()
		return nil
	case err := <-errc:
		cancel()
		wg.Wait()
		return err
	}
	run("recovery", l.recoverLoop)
	run("failover", func(ctx context.Context) error { return l.failoverLoop(ctx, failures) })
	run("dead letters", l.deadLetterLoop)
	healer, err := l.newHealer(ctx)
	if err != nil {
		cancel()
		wg.Wait()
		return err
	}
	run("health", func(ctx context.Context) error { return healer.run(ctx, beats, gone) })
	ctrl, err := s.nc.Subscribe(protocol.SubjectControlFailover, func(m *nats.Msg) { l.manualFailover(ctx, m) })
	if err != nil {
		cancel()
		wg.Wait()
		return fmt.Errorf("subscribe %s: %w", protocol.SubjectControlFailover, err)
	}
	defer func() { _ = ctrl.Unsubscribe() }()
	s.metrics.leader.Set(1)
	defer s.metrics.leader.Set(0)
	log.Info().Msg("leading: lease recovery, agent failover and dead letters active")
	select {
	case <-ctx.Done():
		wg.Wait()
		return nil
	case err := <-errc:
		cancel()
		wg.Wait()
		return err
	}
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
	key := string(m.Data)
	pool, agent, ok := strings.Cut(key, ".")
	if !ok || !protocol.ValidToken(pool) || !protocol.ValidToken(agent) {
		_ = m.Respond([]byte("error: expected <pool>.<agent>, got " + strconv.Quote(key)))
		return
	}
	p := protocol.Presence{ID: agent, Pool: pool}
	for _, a := range l.view.Pool(pool) {
		if a.ID == agent {
			p = a
		}
	}
	l.log.Warn().Str("agent", key).Msg("failover requested by an operator")
	rec, err := l.failoverRecord(ctx, suspect{presence: p, since: l.now()})
	if err != nil {
		_ = m.Respond([]byte("error: " + err.Error()))
		return
	}
	_ = m.Respond([]byte(fmt.Sprintf("failover %s: %d tasks moved to %v, %d waiting (%s)", rec.ID, rec.TasksMoved, rec.Targets, rec.Waiting, rec.Outcome)))
}
