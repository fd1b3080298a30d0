package ops

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Metrics of the deployment as a whole, served by `warden api` (seed 000's
// set with the warden_ prefix; docs/api.md#metrics). Two kinds:
//
//   - read at scrape time from JetStream (Collector): queue and dead-letter
//     depth, each agent's health score, heartbeat age, completion rate and
//     assignment score, each cluster's members, leader and health;
//   - counted from what flows by (Feed): queue latency from the job store's
//     record headers, healing actions, failover durations and retries by
//     reason from WARDEN_EVENTS.
//
// The scheduler, supervisor and agents serve their own counters (jobs,
// dispatches, results, failovers, transfers, dead letters, healing cycle
// duration) on their own /metrics.

var (
	descQueueDepth     = prometheus.NewDesc("warden_queue_depth", "Tasks stored in the task streams (waiting or in flight), by pool and priority.", []string{"pool", "priority"}, nil)
	descDLQDepth       = prometheus.NewDesc("warden_dead_letter_queue_depth", "Dead letters stored in WARDEN_DLQ.", nil, nil)
	descHealthScore    = prometheus.NewDesc("warden_health_score", "The supervisor leader's health score of an agent, 0..1.", []string{"pool", "agent", "level"}, nil)
	descHeartbeatAge   = prometheus.NewDesc("warden_heartbeat_age_seconds", "Seconds since an agent's last heartbeat.", []string{"pool", "agent"}, nil)
	descCompletionRate = prometheus.NewDesc("warden_task_completion_rate", "Share of an agent's (or a cluster's members') finished tasks that succeeded, 0..1.", []string{"pool", "agent", "cluster"}, nil)
	descAssignScore    = prometheus.NewDesc("warden_assignment_score", "Selection score of an agent: success rate / (1 + load), scaled down by degraded health.", []string{"pool", "agent"}, nil)
	descAgents         = prometheus.NewDesc("warden_agents", "Present agents, by pool and whether draining.", []string{"pool", "draining"}, nil)
	descClusterMembers = prometheus.NewDesc("warden_cluster_members", "Members of a cluster, by role and health.", []string{"cluster", "role", "healthy"}, nil)
	descClusterLeader  = prometheus.NewDesc("warden_cluster_leader", "1 for the agent leading a cluster.", []string{"cluster", "leader"}, nil)
	descClusterHealth  = prometheus.NewDesc("warden_cluster_health", "Cluster health: 1 healthy, 0.5 degraded (below desired), 0 under-replicated or without a leader.", []string{"cluster", "status"}, nil)
	descScrapeErrors   = prometheus.NewDesc("warden_state_scrape_errors", "Sources that could not be read during this scrape.", []string{"source"}, nil)
)

// Collector reads the deployment's state at each scrape.
type Collector struct {
	o   *Ops
	log zerolog.Logger
}

// NewCollector returns a collector over o. Register it explicitly.
func NewCollector(o *Ops, log zerolog.Logger) *Collector { return &Collector{o: o, log: log} }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueueDepth, descDLQDepth, descHealthScore, descHeartbeatAge, descCompletionRate,
		descAssignScore, descAgents, descClusterMembers, descClusterLeader, descClusterHealth, descScrapeErrors} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fail := func(source string, err error) {
		c.log.Debug().Err(err).Str("source", source).Msg("metrics scrape")
		ch <- prometheus.MustNewConstMetric(descScrapeErrors, prometheus.GaugeValue, 1, source)
	}
	agents, err := c.o.Agents(ctx)
	if err != nil {
		fail("agents", err)
	}
	rate := map[string]float64{}
	draining := map[[2]string]float64{}
	for _, a := range agents {
		draining[[2]string{a.Pool, boolLabel(a.Draining)}]++
		ch <- prometheus.MustNewConstMetric(descHeartbeatAge, prometheus.GaugeValue, a.HeartbeatAgeSeconds, a.Pool, a.ID)
		r := successRate(a)
		rate[protocol.PresenceKey(a.Pool, a.ID)] = r
		ch <- prometheus.MustNewConstMetric(descCompletionRate, prometheus.GaugeValue, r, a.Pool, a.ID, "")
		score := r / (1 + a.Load)
		if a.Health != nil {
			ch <- prometheus.MustNewConstMetric(descHealthScore, prometheus.GaugeValue, a.Health.Score, a.Pool, a.ID, a.Health.Level.String())
			if a.Health.Level == health.Degraded || a.Health.Level == health.Warning {
				score *= a.Health.Score
			}
			if a.Health.Level == health.Critical || a.Health.Level == health.Failed {
				score = 0
			}
		}
		ch <- prometheus.MustNewConstMetric(descAssignScore, prometheus.GaugeValue, score, a.Pool, a.ID)
	}
	for k, n := range draining {
		ch <- prometheus.MustNewConstMetric(descAgents, prometheus.GaugeValue, n, k[0], k[1])
	}
	if q, err := c.o.Queues(ctx); err != nil {
		fail("queues", err)
	} else {
		byPool := map[string]float64{}
		for _, a := range agents {
			byPool[a.Pool] += 0 // a pool with agents and an empty queue is 0, not absent
		}
		for _, t := range q.Tasks {
			for _, s := range t.Subjects {
				byPool[s.Pool] += float64(s.Messages)
			}
		}
		for pool, n := range byPool {
			ch <- prometheus.MustNewConstMetric(descQueueDepth, prometheus.GaugeValue, n, pool, "all")
		}
		ch <- prometheus.MustNewConstMetric(descDLQDepth, prometheus.GaugeValue, float64(q.DeadLetters))
	}
	c.collectClusters(ctx, ch, rate, fail)
}

func (c *Collector) collectClusters(ctx context.Context, ch chan<- prometheus.Metric, rate map[string]float64, fail func(string, error)) {
	cs, err := cluster.Open(ctx, c.o.js)
	if err != nil {
		return // no clusters bucket: clusters are not used here
	}
	defs, err := cs.List(ctx)
	if err != nil {
		fail("clusters", err)
		return
	}
	for _, d := range defs {
		st, _, err := cs.State(ctx, d.Name)
		if err != nil {
			// Defined, but no leader has written a state yet.
			ch <- prometheus.MustNewConstMetric(descClusterHealth, prometheus.GaugeValue, 0, d.Name, protocol.ClusterNoLeader)
			continue
		}
		members := map[[2]string]float64{}
		var sum float64
		var n int
		for _, m := range st.Members {
			members[[2]string{m.Role, boolLabel(m.Healthy)}]++
			if r, ok := rate[m.Key]; ok {
				sum += r
				n++
			}
		}
		for k, v := range members {
			ch <- prometheus.MustNewConstMetric(descClusterMembers, prometheus.GaugeValue, v, d.Name, k[0], k[1])
		}
		if st.Leader != "" {
			ch <- prometheus.MustNewConstMetric(descClusterLeader, prometheus.GaugeValue, 1, d.Name, st.Leader)
		}
		h := 0.0
		switch st.Status {
		case protocol.ClusterHealthy:
			h = 1
		case protocol.ClusterDegraded:
			h = 0.5
		}
		ch <- prometheus.MustNewConstMetric(descClusterHealth, prometheus.GaugeValue, h, d.Name, st.Status)
		if n > 0 {
			ch <- prometheus.MustNewConstMetric(descCompletionRate, prometheus.GaugeValue, sum/float64(n), "", "", d.Name)
		}
	}
}

// successRate is the assessed success rate when there is one, else the
// agent's lifetime counters (1 for an agent that finished nothing yet).
func successRate(a Agent) float64 {
	if a.Health != nil && a.Health.SuccessRate != nil {
		return *a.Health.SuccessRate
	}
	if done := a.Succeeded + a.Failed; done > 0 {
		return float64(a.Succeeded) / float64(done)
	}
	return 1
}

func boolLabel(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// Feed counts what flows through the job store and WARDEN_EVENTS.
type Feed struct {
	o   *Ops
	log zerolog.Logger

	queueLatency     prometheus.Histogram
	healingActions   *prometheus.CounterVec
	failoverDuration prometheus.Histogram
	retries          *prometheus.CounterVec
}

// NewFeed creates the feed's collectors and registers them with r.
func NewFeed(o *Ops, r prometheus.Registerer, log zerolog.Logger) *Feed {
	f := &Feed{
		o: o, log: log,
		queueLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "warden_queue_latency_seconds",
			Help:    "From a job's acceptance to the dispatch of its first step (the step starts on its agent at once).",
			Buckets: []float64{.001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}),
		healingActions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warden_healing_actions_total",
			Help: "Self-healing actions taken, by type (deprioritise, reduce_load, drain, failover, restore, readmit_excluded, request_agents; other for anything else)."}, []string{"type"}),
		failoverDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "warden_failover_duration_seconds",
			Help: "How long agent failovers took, from detection to the last task moved.", Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 10)}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warden_retries_total",
			Help: "Steps dispatched again after their agent lost them, by reason (lease_expired, transferred; other for anything else); handler retries are warden_results_applied_total{status=\"failed\"}."}, []string{"reason"}),
	}
	r.MustRegister(f.queueLatency, f.healingActions, f.failoverDuration, f.retries)
	// Present from the first scrape, at zero.
	f.healingActions.WithLabelValues("drain")
	return f
}

// Feed restarts: the first wait after a feed failed, doubling to the last.
const (
	feedRetryFirst = 500 * time.Millisecond
	feedRetryMax   = 30 * time.Second
)

// Run counts until ctx ends: the events stored from its start on, and new
// job-store writes. Events stored before are not counted: they were
// counted by the process that saw them, and counting them again at each
// start made the counters of a restarted API fall (once old events aged
// out of the stream) or jump (history counted as new by increase()). A feed that fails (at start: its stream is not
// there yet; later: NATS went away) is logged at once and started again
// after a backoff, from where it stopped, while the other goes on: before,
// its error waited for the other feed to end at shutdown, and the healing
// and failover metrics stayed missing without a word. Run returns nil when
// ctx ends.
func (f *Feed) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	started := time.Now()
	ev := &eventsFeed{f: f, started: started}
	jobs := &jobsFeed{f: f, started: started, created: map[string]time.Time{}, dispatched: map[string]struct{}{}}
	for name, run := range map[string]func(context.Context) error{"events": ev.run, "jobs": jobs.run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.keep(ctx, name, run)
		}()
	}
	wg.Wait()
	return nil
}

// keep runs one feed until ctx ends, starting it again after each failure.
func (f *Feed) keep(ctx context.Context, name string, run func(context.Context) error) {
	wait := feedRetryFirst
	for {
		err := run(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("ended")
		}
		f.log.Warn().Err(err).Str("feed", name).Dur("retry_in", wait).Msg("metrics feed failed; its metrics are not counted until it restarts")
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, feedRetryMax)
	}
}

// eventsFeed counts healing actions, failover durations and retries from
// WARDEN_EVENTS: the events stored from the feed's start on; after a
// restart it goes on after the last event it counted, so nothing is
// counted twice.
//
// The kind is the subject's <kind> token, which the publisher's
// permissions are checked against, not the body's: cluster members may
// publish warden.event.healing.* (internal/creds), and a body claiming
// another kind is ignored. Label values outside the sets the code
// publishes are counted as "other", so a publisher cannot grow a label
// without bound.
type eventsFeed struct {
	f       *Feed
	started time.Time
	last    uint64 // stream sequence of the last event counted
}

// healingActions are the data.action values of healing events: the
// supervisor's (internal/supervisor: deprioritise, reduce_load, drain,
// failover, restore) and a cluster leader's (internal/cluster:
// readmit_excluded, request_agents).
var healingActions = map[string]bool{
	"deprioritise": true, "reduce_load": true, "drain": true, "failover": true, "restore": true,
	"readmit_excluded": true, "request_agents": true,
}

// recoveredStatuses are the data.status values of step_recovered events
// (internal/supervisor/release.go).
var recoveredStatuses = map[string]bool{"lease_expired": true, "transferred": true}

// known returns v when set holds it, else "other".
func known(set map[string]bool, v string) string {
	if set[v] {
		return v
	}
	return "other"
}

// eventKind returns the <kind> token of an event subject,
// warden.event.<kind>.<id>.
func eventKind(subject string) protocol.EventKind {
	rest, ok := strings.CutPrefix(subject, protocol.SubjectEventPrefix+".")
	if !ok {
		return ""
	}
	kind, _, _ := strings.Cut(rest, ".")
	return protocol.EventKind(kind)
}

func (e *eventsFeed) run(ctx context.Context) error {
	f := e.f
	kinds := []protocol.EventKind{protocol.EventHealing, protocol.EventFailover, protocol.EventStepRecovered}
	var filters []string
	for _, k := range kinds {
		filters = append(filters, protocol.EventSubject(k, ">"))
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: filters, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &e.started}
	if e.last > 0 {
		cfg.OptStartTime = nil
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, e.last+1
	}
	cons, err := f.o.js.OrderedConsumer(ctx, protocol.StreamEvents, cfg)
	if err != nil {
		return err
	}
	return each(ctx, cons, func(m jetstream.Msg) {
		if md, err := m.Metadata(); err == nil {
			e.last = md.Sequence.Stream
		}
		var ev protocol.Event
		if json.Unmarshal(m.Data(), &ev) != nil {
			return
		}
		kind := eventKind(m.Subject())
		if ev.Kind != kind {
			return // a body that claims another kind than its subject's
		}
		switch kind {
		case protocol.EventHealing:
			if a := ev.Data["action"]; a != "" {
				f.healingActions.WithLabelValues(known(healingActions, a)).Inc()
			}
		case protocol.EventFailover:
			if d, err := time.ParseDuration(ev.Data["duration"]); err == nil {
				f.failoverDuration.Observe(d.Seconds())
			}
		case protocol.EventStepRecovered:
			f.retries.WithLabelValues(known(recoveredStatuses, ev.Data["status"])).Inc()
		}
	})
}

// jobsFeed observes the queue latency of each new job: its acceptance time
// is the Warden-Created header, its first dispatch the first write carrying
// Warden-Locked-Until (job record for inline steps, step record otherwise).
// It starts with the writes after its start, and after a restart goes on
// after the last write it read.
//
// A job whose first step is dispatched in the turn that accepts it (a
// single-step job, mostly) has a first write that already carries the
// lease: its latency is observed at once, from that write, when the job
// was created after the feed started (else the feed missed its acceptance
// and the job's age is not a queue latency). Before, such jobs were never
// observed. A job observed is remembered until it ends, so that the
// dispatch of a later step is not taken for a first one.
type jobsFeed struct {
	f          *Feed
	started    time.Time
	last       uint64
	created    map[string]time.Time // jobs not yet dispatched
	dispatched map[string]struct{}  // jobs observed, not yet ended
}

func (jf *jobsFeed) run(ctx context.Context) error {
	f := jf.f
	prefix := "$KV." + protocol.BucketJobs + "."
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{prefix + ">"}, DeliverPolicy: jetstream.DeliverNewPolicy, HeadersOnly: true}
	if jf.last > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, jf.last+1
	}
	cons, err := f.o.js.OrderedConsumer(ctx, "KV_"+protocol.BucketJobs, cfg)
	if err != nil {
		return err
	}
	created, dispatched := jf.created, jf.dispatched
	observe := func(job string, c time.Time, md *jetstream.MsgMetadata) {
		delete(created, job)
		dispatched[job] = struct{}{}
		f.queueLatency.Observe(max(md.Timestamp.Sub(c).Seconds(), 0))
	}
	return each(ctx, cons, func(m jetstream.Msg) {
		md, mdErr := m.Metadata()
		if mdErr == nil {
			jf.last = md.Sequence.Stream
		}
		h := m.Headers()
		parts := strings.Split(strings.TrimPrefix(m.Subject(), prefix), ".")
		if len(parts) < 2 {
			return
		}
		job := parts[1]
		locked := h.Get(protocol.HeaderRecordLockedUntil) != ""
		if parts[0] == "job" {
			state := h.Get(protocol.HeaderRecordState)
			if jobstore.JobState(state).Terminal() || jobstore.Removed(h) { // expired and compensated too: kept, they leaked
				delete(created, job)
				delete(dispatched, job)
				return
			}
			_, waiting := created[job]
			_, done := dispatched[job]
			if c, err := time.Parse(time.RFC3339Nano, h.Get(protocol.HeaderRecordCreated)); err == nil && !waiting && !done {
				// Only the write that accepted the job starts its wait:
				// one made before the feed started, or a later write of
				// an older job (a job reopened by a retry, a record
				// rewritten after the feed's start), observed the job's
				// whole age (an hour) as a queue latency.
				accepting := mdErr == nil && !c.Before(jf.started) && md.Timestamp.Sub(c) < acceptWindow
				switch {
				case !accepting:
				case !locked:
					created[job] = c
				default:
					observe(job, c, md) // dispatched in the turn that accepted it
				}
				return
			}
		}
		c, waiting := created[job]
		if !waiting || !locked || mdErr != nil {
			return
		}
		observe(job, c, md)
	})
}

// acceptWindow bounds how long after a job's creation the write of its
// record that accepts it lands: later writes are not acceptances.
const acceptWindow = time.Minute

func each(ctx context.Context, cons jetstream.Consumer, f func(jetstream.Msg)) error {
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer func() {
		stop()
		it.Stop() // a feed that failed is started again: its iterator is not left running
	}()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		f(m)
	}
}
