package protocol

import (
	"strings"
	"time"
)

// Agent clusters (docs/clusters.md). A cluster <name> has keys in two
// buckets. Its definition is in warden_clusters, which only operators
// write:
//
//	<name>                          the ClusterDefinition
//
// Everything its members write is in warden_cluster_runtime:
//
//	<name>.state                    the ClusterState (the cluster leader writes it)
//	<name>.sync                     the ClusterSync: the leader's view members copy
//	<name>.member.<pool>.<agent>    a member's ClusterMemberReport (each member
//	                                writes its own every heartbeat, with a TTL)
//	<name>.req.<id>                 a ClusterRequest (failover, rebalance) the
//	                                leader handles and then deletes
//
// They are apart because the runtime bucket needs limit markers (reports
// expire), so the server keeps roll-ups on for it, and NATS permissions
// cannot refuse a header: a member allowed to write one key there can have
// the server purge the whole bucket with "Nats-Rollup: all". In it that
// costs a moment (members report again, leaders write their state again);
// definitions beside them would be lost for good.
//
// Leadership is the lease cluster.<name> in warden_cluster_leases: apart
// from the supervisor's lease in warden_leases for the same reason (a
// member's roll-up there would depose the supervisor, again and again).
const (
	BucketClusters       = "warden_clusters"
	BucketClusterRuntime = "warden_cluster_runtime"
	BucketClusterLeases  = "warden_cluster_leases"

	// Replication modes.
	ModeActivePassive = "active_passive"
	ModeActiveActive  = "active_active"
	ModeSharded       = "sharded"

	// Failover selection strategies (who becomes leader, who takes work).
	StrategyStandby     = "standby"
	StrategyLeastLoaded = "least_loaded"
	StrategyRoundRobin  = "round_robin"

	// Rebalance policies of a sharded cluster.
	RebalanceAuto   = "auto"
	RebalanceManual = "manual"

	// Member roles in a ClusterState.
	RoleLeader   = "leader"   // active_passive: takes every task; every mode: writes the state
	RoleStandby  = "standby"  // healthy, takes nothing (active_passive; sharded awaiting rebalance)
	RoleMember   = "member"   // takes tasks (active_active) or owns shards (sharded)
	RoleExcluded = "excluded" // failed over by an operator until the next rebalance
	RoleRefused  = "refused"  // beyond membership.max_agents
	RoleOffline  = "offline"  // stopped reporting, drained or assessed failed

	// Cluster statuses.
	ClusterHealthy         = "healthy"
	ClusterDegraded        = "degraded"         // fewer healthy members than desired
	ClusterUnderReplicated = "under_replicated" // fewer healthy members than the minimum
	ClusterNoLeader        = "no_leader"

	// Requests.
	RequestFailover  = "failover"
	RequestRebalance = "rebalance"

	// ClassReroute is the error class of a result by which a cluster member
	// refuses a task routed to it under an epoch that is not its own: the
	// scheduler routes the step again without counting an attempt.
	ClassReroute = "reroute"

	// Task headers of a step dispatched through a cluster.
	HeaderCluster      = "Warden-Cluster"
	HeaderClusterEpoch = "Warden-Cluster-Epoch"
	HeaderTarget       = "Warden-Target"

	// Event kinds about clusters.
	EventClusterCreated         EventKind = "cluster_created"
	EventClusterUpdated         EventKind = "cluster_updated"
	EventClusterDeleted         EventKind = "cluster_deleted"
	EventClusterLeader          EventKind = "cluster_leader_elected"
	EventClusterFailover        EventKind = "cluster_failover"
	EventClusterMemberJoined    EventKind = "cluster_member_joined"
	EventClusterMemberLeft      EventKind = "cluster_member_left"
	EventClusterMemberRefused   EventKind = "cluster_member_refused"
	EventClusterUnderReplicated EventKind = "cluster_under_replicated"
	EventClusterRecovered       EventKind = "cluster_recovered"
	EventClusterRebalanced      EventKind = "cluster_rebalanced"
	EventClusterRequest         EventKind = "cluster_request"
	// EventClusterTransferRetry: a step moved off a failed member was not
	// taken up within task_transfer_timeout and is moved again. Data:
	// cluster, member (who did not take it up), retry, max_retries, timeout.
	EventClusterTransferRetry EventKind = "cluster_transfer_retry"
)

// ClusterDefinition is what an operator defines (YAML or JSON, optionally
// under an agent_cluster: key, as in seed 000).
type ClusterDefinition struct {
	Name        string            `json:"name" yaml:"name"`
	Description string            `json:"description,omitempty" yaml:"description"`
	TargetGroup TargetGroup       `json:"target_group" yaml:"target_group"`
	Membership  ClusterMembership `json:"membership" yaml:"membership"`
	Mode        string            `json:"replication_mode" yaml:"replication_mode"`
	Failover    ClusterFailover   `json:"failover" yaml:"failover"`
	Election    ClusterElection   `json:"leader_election" yaml:"leader_election"`
	StateSync   ClusterStateSync  `json:"state_sync" yaml:"state_sync"`
	Sharding    ClusterSharding   `json:"sharding" yaml:"sharding"`
	Config      map[string]string `json:"config,omitempty" yaml:"config"`
	CreatedAt   time.Time         `json:"created_at,omitzero" yaml:"-"`
	UpdatedAt   time.Time         `json:"updated_at,omitzero" yaml:"-"`
}

// TargetGroup is the named set of targets (hosts, services, shards) the
// cluster's steps act on.
type TargetGroup struct {
	Name    string   `json:"name" yaml:"name"`
	Targets []string `json:"targets,omitempty" yaml:"targets"`
}

// ClusterMembership bounds the number of member agents.
type ClusterMembership struct {
	Minimum int `json:"minimum_agents" yaml:"minimum_agents"`
	Desired int `json:"desired_agents" yaml:"desired_agents"`
	Maximum int `json:"max_agents" yaml:"max_agents"`
	// FailureThreshold is how long a member may stay silent before the
	// leader counts it gone.
	FailureThreshold Duration `json:"failure_threshold" yaml:"failure_threshold"`
}

// ClusterFailover is the failover policy.
type ClusterFailover struct {
	SelectionStrategy   string   `json:"selection_strategy" yaml:"selection_strategy"`
	TaskTransferTimeout Duration `json:"task_transfer_timeout" yaml:"task_transfer_timeout"`
	MaxTransferRetries  int      `json:"max_transfer_retries" yaml:"max_transfer_retries"`
}

// ClusterElection configures the leader lease cluster.<name>.
type ClusterElection struct {
	LeaseDuration Duration `json:"lease_duration" yaml:"lease_duration"`
}

// ClusterStateSync configures how often members re-read the leader's view.
type ClusterStateSync struct {
	Interval Duration `json:"interval" yaml:"interval"`
}

// ClusterSharding configures a sharded cluster.
type ClusterSharding struct {
	// Rebalance: auto gives a joining member its shards at once; manual
	// waits for `warden cluster rebalance`.
	Rebalance string `json:"rebalance" yaml:"rebalance"`
}

// ClusterMember is one member as the leader sees it.
type ClusterMember struct {
	Key     string   `json:"key"`
	Role    string   `json:"role"`
	Healthy bool     `json:"healthy"`
	Reason  string   `json:"reason,omitempty"`
	Targets []string `json:"targets,omitempty"`
	Load    float64  `json:"load"`
	// Digest is the member's reported digest of its copy of the sync state.
	Digest    string    `json:"digest,omitempty"`
	StartedAt time.Time `json:"started_at,omitzero"`
}

// ClusterState is the leader's decision: who leads, who takes what, under
// which epoch. A task dispatched through the cluster carries Epoch; a
// member runs it only under the same epoch.
type ClusterState struct {
	Cluster string `json:"cluster"`
	Mode    string `json:"replication_mode"`
	// Epoch is the cluster epoch. active_passive: the revision of the
	// leader's lease (or, if that is not above the previous epoch, after a
	// mode change, the previous epoch + 1 for the term); other modes: it
	// grows whenever the assignment changes. It never goes down.
	Epoch uint64 `json:"epoch"`
	// Leader is the presence key (<pool>.<agent>) of the lease holder.
	Leader     string `json:"leader"`
	LeaseEpoch uint64 `json:"lease_epoch"`
	// Members, sorted by key.
	Members []ClusterMember `json:"members"`
	// Owners is the set shards are assigned over (sharded), sorted.
	Owners []string `json:"owners,omitempty"`
	// Excluded members take nothing until the next rebalance.
	Excluded []string `json:"excluded,omitempty"`
	// Handoff names the member a manual failover hands leadership to.
	Handoff string `json:"handoff,omitempty"`
	Status  string `json:"status"`
	Healthy int    `json:"healthy"`
	Minimum int    `json:"minimum"`
	Desired int    `json:"desired"`
	Maximum int    `json:"maximum"`
	// SyncDigest is the digest of the leader's current ClusterSync.
	SyncDigest string    `json:"sync_digest,omitempty"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// Member returns the member with key.
func (s ClusterState) Member(key string) (ClusterMember, bool) {
	for _, m := range s.Members {
		if m.Key == key {
			return m, true
		}
	}
	return ClusterMember{}, false
}

// ClusterSync is the leader's view every member keeps a copy of (seed
// 000's AgentState). Each section maps keys to values; members apply the
// difference between their copy and this one.
type ClusterSync struct {
	Leader     string    `json:"leader"`
	Epoch      uint64    `json:"epoch"`
	CapturedAt time.Time `json:"captured_at"`
	// AssignedTargets maps each target to the member that serves it.
	AssignedTargets map[string]string `json:"assigned_targets,omitempty"`
	// TaskStates maps a task (job.step) to its state as the leader knows it.
	TaskStates map[string]string `json:"task_states,omitempty"`
	// Configuration is the cluster's configuration (the definition's config).
	Configuration map[string]string `json:"configuration,omitempty"`
	// CachedDigests are content digests the leader holds (artifacts, images).
	CachedDigests map[string]string `json:"cached_digests,omitempty"`
	// Digest is the digest of the four sections (see internal/cluster).
	Digest string `json:"digest"`
}

// ClusterMemberReport is what a member writes about itself every heartbeat.
type ClusterMemberReport struct {
	Cluster       string    `json:"cluster"`
	Pool          string    `json:"pool"`
	ID            string    `json:"id"`
	InFlight      int       `json:"in_flight"`
	MaxConcurrent int       `json:"max_concurrent"`
	Draining      bool      `json:"draining,omitempty"`
	Health        string    `json:"health,omitempty"`
	Role          string    `json:"role,omitempty"`
	Epoch         uint64    `json:"epoch"`
	Digest        string    `json:"digest,omitempty"`
	StartedAt     time.Time `json:"started_at"`
	HeartbeatAt   time.Time `json:"heartbeat_at"`
}

// Key is the member's presence key.
func (r ClusterMemberReport) Key() string { return PresenceKey(r.Pool, r.ID) }

// ClusterRequest asks the cluster leader for an operation.
type ClusterRequest struct {
	ID          string    `json:"id"`
	Op          string    `json:"op"`
	From        string    `json:"from,omitempty"`
	To          string    `json:"to,omitempty"`
	Reason      string    `json:"reason,omitempty"`
	RequestedAt time.Time `json:"requested_at"`
	// ClaimedBy is the leader that took the request (a compare-and-set on
	// it before acting): from then on the requester cannot withdraw it.
	ClaimedBy string `json:"claimed_by,omitempty"`
}

// ClusterStateKey and the functions below name a cluster's keys in
// warden_cluster_runtime (the definition's key is the cluster's name).
func ClusterStateKey(name string) string { return name + ".state" }

// ClusterSyncKey is the key of the leader's sync state.
func ClusterSyncKey(name string) string { return name + ".sync" }

// ClusterMemberKey is the key of a member's report.
func ClusterMemberKey(name, pool, agent string) string {
	return name + ".member." + pool + "." + agent
}

// ClusterMembersFilter matches every member report of a cluster.
func ClusterMembersFilter(name string) string { return name + ".member.>" }

// ClusterRequestKey is the key of a request.
func ClusterRequestKey(name, id string) string { return name + ".req." + id }

// ClusterRequestsFilter matches every pending request of a cluster.
func ClusterRequestsFilter(name string) string { return name + ".req.*" }

// ClusterLeaseKey is the cluster's leader lease in warden_cluster_leases.
func ClusterLeaseKey(name string) string { return "cluster." + name }

// ClusterOfKey splits a cluster key (of either bucket) into the cluster
// name and the rest ("" for the definition itself).
func ClusterOfKey(key string) (name, rest string) {
	name, rest, _ = strings.Cut(key, ".")
	return name, rest
}
