package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/natsconn"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// setupTimeout bounds each start-up and shutdown call to the server.
const setupTimeout = 10 * time.Second

// Run connects, ensures the agent's consumer, announces its presence and
// runs tasks until ctx ends; then it drains: presence says draining, no new
// task is fetched, in-flight tasks get DrainTimeout to finish, the rest are
// cancelled and handed back, and the presence key is deleted. Run returns
// nil after a drain caused by ctx, a *presence.DuplicateError (wrapped) if
// another live agent holds this id, or the start-up error. If the
// connection closes for good, the handlers in flight are cancelled at once
// (ErrConnectionClosed), no drain is waited out, and Run returns an error
// wrapping nats.ErrConnectionClosed. Run may be called once.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.resolveActions(); err != nil {
		return err
	}
	a.startedAt = a.now().UTC()
	a.host = hostname()
	a.shard = protocol.Shard(a.cfg.Pool, a.cfg.ID, a.cfg.TaskShards)
	if a.nc == nil {
		opts := a.cfg.NATS
		opts.Name = "warden-agent " + a.cfg.Pool + "." + a.cfg.ID
		nc, _, err := natsconn.Connect(opts, a.log)
		if err != nil {
			return err
		}
		a.nc, a.ownConn = nc, true
		defer nc.Close()
	}
	js, err := jetstream.New(a.nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	a.js = js

	ann, stopAnnouncer, err := a.start(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: nothing to drain
		}
		return err
	}
	defer stopAnnouncer()
	if err := a.startCluster(ctx); err != nil {
		return err
	}
	stopMetrics := a.serveMetrics(ctx)
	defer stopMetrics()
	ctrl, err := a.serveControl()
	if err != nil {
		// The member runs detached from ctx (it steps down in the drain
		// below, which this return skips): stop it, or it would campaign on
		// and could hold the cluster's lease until the process exits.
		a.stopCluster()
		return err
	}
	defer func() { _ = ctrl.Unsubscribe() }()
	close(a.ready)
	a.log.Info().Str("task_subject", a.TaskSubject()).Strs("actions", a.allowedNames).
		Int("max_concurrent", a.cfg.MaxConcurrent).Msg("agent ready")

	fetchCtx, stopFetch := context.WithCancel(ctx)
	defer stopFetch()
	// Handlers outlive ctx: the drain decides when they are cancelled.
	workCtx, stopWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopWork(ErrShutdown)
	var tasks sync.WaitGroup
	dispatched := make(chan struct{})
	go func() {
		defer close(dispatched)
		a.dispatch(fetchCtx, workCtx, &tasks)
	}()
	// Until the drain is over, not only while fetching: a server that
	// restarts during the drain forgets the task consumer, and the lease
	// extensions of the tasks still running found no responder; they
	// were abandoned unreported.
	repullCtx, stopRepull := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRepull()
	repulled := make(chan struct{})
	go func() {
		defer close(repulled)
		a.repullOnReconnect(repullCtx)
	}()

	// A connection closed for good (the caller's, given with WithConn, at
	// the end of its reconnect attempts, or closed by its owner) never
	// comes back: the agent could not take a task or heartbeat again, and
	// Run waited for ever with no error for its caller to act on.
	closed := a.nc.StatusChanged(nats.CLOSED)
	defer a.nc.RemoveStatusListener(closed)
	if a.nc.IsClosed() {
		closed <- nats.CLOSED // closed before the listener was in place
	}
	var runErr error
	select {
	case <-ctx.Done():
		a.log.Info().Msg("stop requested: draining")
	case <-ann.Done():
		runErr = fmt.Errorf("agent %s stops: %w", a.cfg.ID, ann.Err())
		a.log.Error().Err(runErr).Msg("presence lost: draining")
	case <-closed:
		runErr = fmt.Errorf("agent %s stops: %w", a.cfg.ID, nats.ErrConnectionClosed)
		a.log.Error().Err(runErr).Msg("connection closed for good: stopping")
	}
	stopFetch()
	<-dispatched
	a.drain(ann, &tasks, stopWork, closed)
	stopRepull()
	<-repulled
	if n := a.stats.abandoned.Load(); n > 0 {
		a.log.Warn().Int64("handlers", n).Msg("handlers that ignored cancellation still run (their tasks were reported or given up); they end with the process")
	}
	a.stopCluster()

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), setupTimeout)
	defer cancel()
	if !a.ownConn {
		// Acks are plain publishes (report.go): on a connection the caller
		// owns, make sure they left before Run returns and the caller exits.
		if err := a.nc.FlushWithContext(sctx); err != nil {
			a.log.Warn().Err(err).Msg("acks and naks not flushed to the server")
		}
	}
	if err := ann.Stop(sctx); err != nil {
		a.log.Warn().Err(err).Msg("presence not deleted; it expires by itself")
	}
	if a.ownConn {
		_ = a.nc.Drain() // flush acks and naks before closing
	}
	a.log.Info().Interface("stats", a.Stats()).Msg("agent stopped")
	return runErr
}

// start ensures the consumer and announces presence. The returned
// Announcer heartbeats until Stop, independently of ctx, so that the agent
// stays visible (as draining) during the drain.
func (a *Agent) start(ctx context.Context) (*presence.Announcer, context.CancelFunc, error) {
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	if err := a.checkDeployment(sctx); err != nil {
		return nil, nil, err
	}
	cons, err := a.ensureConsumer(sctx)
	if err != nil {
		return nil, nil, err
	}
	a.cons = cons
	kv, err := a.js.KeyValue(sctx, protocol.BucketPresence)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil, fmt.Errorf("%w: presence bucket %s does not exist: the scheduler or `warden dev` creates it, start one first",
			ErrStreamsMissing, protocol.BucketPresence)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("presence bucket: %w", err)
	}
	ann, err := presence.NewAnnouncer(kv, presence.AnnouncerConfig{
		Pool: a.cfg.Pool, ID: a.cfg.ID, Interval: a.cfg.HeartbeatInterval.Std(),
		Presence: a.presence, Now: a.now, Logger: a.log,
	})
	if err != nil {
		return nil, nil, err
	}
	// Announcing may wait for a crashed run's key to expire (TTL+1s), so it
	// gets its own bound, and is interrupted when ctx ends.
	annCtx, annCancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, annCancel)
	defer stop()
	if err := ann.Start(annCtx); err != nil {
		annCancel()
		return nil, nil, fmt.Errorf("announce presence: %w", err)
	}
	return ann, annCancel, nil
}

// checkDeployment refuses to start when the deployment record says another
// task_shards: this agent would consume a shard no scheduler publishes to.
// A record it cannot read (none yet, or no permission) is logged, not fatal.
func (a *Agent) checkDeployment(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err := streams.VerifyDeployment(ctx, a.js, protocol.Deployment{TaskShards: a.cfg.TaskShards})
	var mm *streams.MismatchError
	if errors.As(err, &mm) {
		return err
	}
	if err != nil {
		a.log.Warn().Err(err).Int("task_shards", a.cfg.TaskShards).Msg("deployment record not readable: task_shards not checked")
	}
	return nil
}

// ensureConsumer creates or updates the agent's durable task consumer.
func (a *Agent) ensureConsumer(ctx context.Context) (jetstream.Consumer, error) {
	name := protocol.TaskStream(a.shard)
	stream, err := a.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: task stream %s does not exist: the scheduler or `warden dev` creates the streams, "+
			"start one first (and check that task_shards=%d matches the deployment)", ErrStreamsMissing, name, a.cfg.TaskShards)
	}
	if err != nil {
		return nil, fmt.Errorf("task stream %s: %w", name, err)
	}
	cc, err := streams.TaskConsumer(a.shard, a.cfg.Pool, a.cfg.ID, a.cfg.Lease.Std(), a.cfg.MaxDeliver, a.cfg.MaxConcurrent)
	if err != nil {
		return nil, err
	}
	// The server counts pull requests and held tasks (until their ack wait
	// passes; each lease extension restarts it) as activity, so a busy agent
	// that does not pull keeps its consumer; restoreConsumer and the
	// dispatch loop create it again should it go while the agent was away.
	cc.InactiveThreshold = max(a.cfg.ConsumerInactiveThreshold.Std(), 0)
	cons, err := stream.CreateOrUpdateConsumer(ctx, cc)
	if err != nil {
		// An earlier release kept the consumer on disk: the server does not
		// change its storage type, so it is replaced (it is this agent's own).
		if replaced, _ := streams.ReplaceStorage(ctx, a.js, name, cc, nil); replaced {
			a.log.Info().Bool("memory_storage", cc.MemoryStorage).Msg("task consumer re-created with the storage type this release uses")
			cons, err = stream.CreateOrUpdateConsumer(ctx, cc)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("task consumer %s on %s: %w", cc.Durable, name, err)
	}
	return cons, nil
}

// drain marks the agent draining, waits DrainTimeout for in-flight tasks,
// then cancels the rest (they hand their tasks back) and waits a little more.
//
// A connection closed for good (before the drain, or during it: closed)
// cancels the handlers at once, with ErrConnectionClosed: what
// they finish can be neither reported nor handed back, and the supervisor
// moves their steps to other agents, where they would run twice. Waiting
// out the drain then only kept Run from returning (42 s by default).
func (a *Agent) drain(ann *presence.Announcer, tasks *sync.WaitGroup, stopWork context.CancelCauseFunc,
	closed <-chan nats.Status) {
	a.draining.Store(true)
	done := make(chan struct{})
	// This goroutine outlives Run only if a handler ignores cancellation
	// forever; the process is exiting then anyway.
	go func() { tasks.Wait(); close(done) }()
	if a.nc.IsClosed() { // a closed connection never opens again
		a.log.Warn().Int("in_flight", a.Stats().InFlight).Msg("cancelling handlers: their tasks can be neither reported nor handed back")
		a.cancelWork(done, stopWork, ErrConnectionClosed)
		return
	}
	bctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	if err := ann.Beat(bctx); err != nil {
		a.log.Warn().Err(err).Msg("could not announce draining")
	}
	cancel()

	a.log.Info().Int("in_flight", a.Stats().InFlight).Dur("drain_timeout", a.cfg.DrainTimeout.Std()).Msg("draining")
	t := time.NewTimer(a.cfg.DrainTimeout.Std())
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		a.log.Warn().Int("in_flight", a.Stats().InFlight).Msg("drain timeout: cancelling handlers and handing their tasks back")
		a.cancelWork(done, stopWork, ErrShutdown)
	case <-closed:
		a.log.Error().Int("in_flight", a.Stats().InFlight).Msg("connection closed for good while draining: cancelling handlers")
		a.cancelWork(done, stopWork, ErrConnectionClosed)
	}
}

// cancelWork cancels the handlers still running with cause and waits a
// little for them (done) to return and settle their tasks.
func (a *Agent) cancelWork(done <-chan struct{}, stopWork context.CancelCauseFunc, cause error) {
	stopWork(cause)
	giveUp := time.NewTimer(maxReportMargin + setupTimeout)
	defer giveUp.Stop()
	select {
	case <-done:
	case <-giveUp.C:
		a.log.Error().Int("in_flight", a.Stats().InFlight).Msg("handlers ignore cancellation; exiting without them")
	}
}
