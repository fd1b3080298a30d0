package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Errors a Member's Accept returns for a task it must not run. Both are
// retriable: the task goes back and is routed again under the current epoch.
var (
	ErrNotLeader   = errors.New("cluster: this member is not the leader")
	ErrNotOwner    = errors.New("cluster: this member does not own the task's target")
	ErrStaleEpoch  = errors.New("cluster: the task's cluster epoch is not this member's")
	ErrNotDefined  = errors.New("cluster: not defined")
	ErrNotAccepted = errors.New("cluster: this member takes no tasks")
)

// MemberConfig configures a Member.
type MemberConfig struct {
	// Cluster, Pool and ID name the cluster and this agent.
	Cluster, Pool, ID string
	// Interval between reports. Defaults to 1s.
	Interval time.Duration
	// Stagger is how long each election rank waits after the one before.
	// Defaults to 250ms.
	Stagger time.Duration
	// StartedAt is when the agent started (admission order).
	StartedAt time.Time
	// Load returns the tasks in flight and the most that run at once.
	Load func() (inFlight, max int)
	// Draining reports whether the agent is draining (it then leads nothing).
	Draining func() bool
	Now      func() time.Time
	Logger   zerolog.Logger
}

// View is a member's picture of its cluster, for handlers.
type View struct {
	Cluster string `json:"cluster"`
	// Defined is false while no definition of the cluster exists.
	Defined bool   `json:"defined"`
	Mode    string `json:"replication_mode,omitempty"`
	Epoch   uint64 `json:"epoch"`
	Leader  string `json:"leader,omitempty"`
	// IsLeader is true while this member provably holds the lease.
	IsLeader bool   `json:"is_leader"`
	Role     string `json:"role,omitempty"`
	// Targets this member serves (sharded: its shards; active_passive
	// leader: the whole target group).
	Targets []string `json:"targets,omitempty"`
	Status  string   `json:"status,omitempty"`
	// Digest of this member's copy of the sync state, and whether it
	// matches the leader's.
	Digest string `json:"digest,omitempty"`
	InSync bool   `json:"in_sync"`
}

type seen struct {
	report protocol.ClusterMemberReport
	at     time.Time // when this member last saw it (its own clock)
}

// Member is the membership work an agent does for its cluster: report,
// campaign, lead, follow the state and keep a copy of the sync state.
type Member struct {
	cfg    MemberConfig
	js     jetstream.JetStream
	store  *Store
	leases jetstream.KeyValue
	key    string
	lease  *lease
	sight  *sight
	log    zerolog.Logger
	wake   chan struct{}

	mu         sync.Mutex
	def        *protocol.ClusterDefinition
	state      protocol.ClusterState
	stateRev   uint64
	copy       protocol.ClusterSync // this member's copy of the sync state
	leaderSync protocol.ClusterSync // what this member publishes while leading
	health     string
	reports    map[string]seen
	requests   map[string]pendingRequest
	holder     string    // who holds the lease, as last seen ("" free)
	sitOut     time.Time // do not campaign before (after handing off)
	watchers   []chan View
	ready      chan struct{} // closed once both watches read their keys
	// defSynced and runtimeSynced: each watch has read its keys once.
	defSynced, runtimeSynced bool
	stopped                  chan struct{} // closed when Run returns (Watch channels close)
	// syncRev is the newest revision of <name>.sync seen: a write after the
	// leader's own last one (a deposed leader's late write) makes it
	// publish again.
	syncRev uint64
	// resigned are the epochs this member led under and gave up of its own
	// accord (not deposed), newest last: results of tasks run under them
	// may still be reported. Every term has its own epoch, so it is a set,
	// not one value: a leader that leads again must not forget the tasks of
	// the term before.
	resigned []uint64
	// took records, for the recent epochs in which this member took work
	// (active_active member, sharded owner), the owners of that epoch
	// (nil for active_active): a draining member reports the tasks it was
	// given under them.
	took map[uint64][]string
	// epochSeen is the highest epoch of any state this member read or
	// wrote: a leader that finds the state gone (deleted by hand, a
	// roll-up of the runtime bucket) writes the next one above it, never
	// an epoch used before with other owners (epochs never decrease).
	epochSeen uint64
}

// pendingRequest is a request as this member last saw it, with its
// revision: the leader claims it at that revision before acting.
type pendingRequest struct {
	protocol.ClusterRequest
	rev uint64
}

// maxResigned bounds Member.resigned and Member.took: a task older than this
// many of this member's terms (or epochs taking work) is rerouted rather
// than reported.
const maxResigned = 32

// NewMember binds a member to the cluster buckets.
func NewMember(ctx context.Context, js jetstream.JetStream, cfg MemberConfig) (*Member, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Stagger <= 0 {
		cfg.Stagger = 250 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Load == nil {
		cfg.Load = func() (int, int) { return 0, 1 }
	}
	if cfg.Draining == nil {
		cfg.Draining = func() bool { return false }
	}
	if !protocol.ValidToken(cfg.Cluster) {
		return nil, fmt.Errorf("cluster %q must be 1-128 characters of letters, digits, '-' or '_'", cfg.Cluster)
	}
	st, err := Open(ctx, js)
	if err != nil {
		return nil, err
	}
	leases, err := js.KeyValue(ctx, protocol.BucketClusterLeases)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", protocol.BucketClusterLeases, err)
	}
	status, err := leases.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", protocol.BucketClusterLeases, err)
	}
	key := protocol.PresenceKey(cfg.Pool, cfg.ID)
	l := &lease{js: js, kv: leases, key: protocol.ClusterLeaseKey(cfg.Cluster), who: key, now: cfg.Now, bucketTTL: status.TTL()}
	l.setTTL(DefaultLeaseDuration)
	m := &Member{
		cfg: cfg, js: js, store: st, leases: leases, key: key,
		lease: l,
		sight: newSight(js.Conn()),
		log:   cfg.Logger.With().Str("cluster", cfg.Cluster).Logger(),
		wake:  make(chan struct{}, 1), reports: map[string]seen{}, requests: map[string]pendingRequest{},
		ready: make(chan struct{}), stopped: make(chan struct{}),
	}
	return m, nil
}

// Key is the member's presence key.
func (m *Member) Key() string { return m.key }

// Ready is closed once the member has read its cluster's keys.
func (m *Member) Ready() <-chan struct{} { return m.ready }

func (m *Member) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Run does the membership work until ctx ends; then it steps down and
// removes its report so the leader sees it leave at once.
func (m *Member) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, f := range []func(context.Context) error{m.watchDefinition, m.watchCluster, m.watchLease, m.watchHealth} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if err := f(ctx); err != nil && ctx.Err() == nil {
					m.log.Warn().Err(err).Msg("cluster watch broke; restarting")
					select {
					case <-ctx.Done():
					case <-time.After(time.Second):
					}
				}
			}
		}()
	}
	wg.Add(2)
	go func() { defer wg.Done(); m.reportLoop(ctx) }()
	go func() { defer wg.Done(); m.electionLoop(ctx) }()
	wg.Wait()
	// Nothing changes the view any more: end every Watch (a caller ranging
	// over one with a longer-lived context would wait forever).
	m.mu.Lock()
	close(m.stopped)
	for _, ch := range m.watchers {
		close(ch)
	}
	m.watchers = nil
	m.mu.Unlock()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = m.store.rt.Delete(sctx, protocol.ClusterMemberKey(m.cfg.Cluster, m.cfg.Pool, m.cfg.ID))
	return nil
}

func (m *Member) reportLoop(ctx context.Context) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	var lastSync time.Time
	for {
		m.writeReport(ctx)
		m.sight.poll(m.cfg.Now()) // date a reconnect close to when it happened
		m.mu.Lock()
		interval := DefaultSyncInterval
		if m.def != nil {
			interval = m.def.StateSync.Interval.Std()
		}
		m.mu.Unlock()
		if now := m.cfg.Now(); now.Sub(lastSync) >= interval {
			lastSync = now
			m.resync(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reportTTL keeps a dead member's report long enough to be shown offline.
func (m *Member) reportTTL() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := 30 * time.Second
	if m.def != nil {
		d = max(d, 10*m.def.Membership.FailureThreshold.Std())
	}
	return d
}

func (m *Member) writeReport(ctx context.Context) {
	in, mx := m.cfg.Load()
	v := m.View()
	m.mu.Lock()
	r := protocol.ClusterMemberReport{
		Cluster: m.cfg.Cluster, Pool: m.cfg.Pool, ID: m.cfg.ID, InFlight: in, MaxConcurrent: mx,
		Draining: m.cfg.Draining(), Health: m.health, Role: v.Role, Epoch: v.Epoch, Digest: m.copy.Digest,
		StartedAt: m.cfg.StartedAt, HeartbeatAt: m.cfg.Now().UTC(),
	}
	m.mu.Unlock()
	b, _ := json.Marshal(r)
	subj := "$KV." + protocol.BucketClusterRuntime + "." + protocol.ClusterMemberKey(m.cfg.Cluster, m.cfg.Pool, m.cfg.ID)
	pctx, cancel := context.WithTimeout(ctx, m.cfg.Interval)
	defer cancel()
	if _, err := m.js.Publish(pctx, subj, b, jetstream.WithMsgTTL(m.reportTTL())); err != nil && ctx.Err() == nil {
		m.log.Warn().Err(err).Msg("cluster report failed")
	}
}
