package creds

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Role is one NATS identity's permissions: what it may publish and
// subscribe to, and whether it may answer requests it received (allow
// responses: a reply to the requester's inbox, once, within a minute).
// Everything not allowed is refused by the server.
type Role struct {
	// Name is the user name in the JWT and the identity in the inbox prefix.
	Name string `json:"name"`
	// Purpose says who uses this credential.
	Purpose string `json:"purpose"`
	// Pub and Sub are the allowed subjects (NATS wildcards).
	Pub []string `json:"pub"`
	Sub []string `json:"sub"`
	// Responses lets the identity reply to requests it received.
	Responses bool `json:"responses"`
}

// Role names of the fixed identities.
const (
	RoleSetup      = "setup"
	RoleScheduler  = "scheduler"
	RoleSupervisor = "supervisor"
	RolePublisher  = "publisher"
	RoleReadonly   = "readonly"
	RoleAdmin      = "admin"
	RoleAPI        = "api"
)

// FixedRoles lists the fixed identities in the order `warden creds` makes them.
var FixedRoles = []string{RoleSetup, RoleScheduler, RoleSupervisor, RolePublisher, RoleReadonly, RoleAdmin, RoleAPI}

// InboxPrefix is the only inbox prefix an identity may subscribe to
// (nats.CustomInboxPrefix): replies to one process cannot be read by another
// identity.
func InboxPrefix(identity string) string { return "_INBOX." + identity }

// AgentIdentity is an agent's user name and inbox identity.
func AgentIdentity(pool, agent string) string { return "agent." + pool + "." + agent }

func inbox(identity string) string { return InboxPrefix(identity) + ".>" }

// JetStream API subjects, named as the server defines them.
func streamInfo(s string) string { return "$JS.API.STREAM.INFO." + s }
func msgGet(s string) string     { return "$JS.API.STREAM.MSG.GET." + s }
func msgDelete(s string) string  { return "$JS.API.STREAM.MSG.DELETE." + s }
func directGet(s string) []string {
	return []string{"$JS.API.DIRECT.GET." + s, "$JS.API.DIRECT.GET." + s + ".>"}
}
func flowControl(s string) string { return "$JS.FC." + s + ".>" }
func ack(s string) string         { return "$JS.ACK." + s + ".>" }

// watchKeys is reading and watching the keys of bucket that subject
// ($KV.<bucket>.<key or filter>) matches, and nothing else of it: direct
// gets of those keys, consumers filtered on them (a consumer an agent may
// create chooses its own deliver_subject, docs/security.md), and deleting
// its own watch's consumer (nats.go names them at random).
func watchKeys(bucket, subject string) []string {
	s := "KV_" + bucket
	return []string{streamInfo(s), "$JS.API.DIRECT.GET." + s + "." + subject,
		"$JS.API.CONSUMER.CREATE." + s + ".*." + subject, "$JS.API.CONSUMER.DELETE." + s + ".*", flowControl(s)}
}

// consumers is what a role needs to create and use consumers of any name on
// stream s: create (with or without a filter in the subject), info, pull,
// delete (nats.go deletes its ordered consumers when a watch stops), ack
// and flow control.
func consumers(s string) []string {
	return []string{
		"$JS.API.CONSUMER.CREATE." + s, "$JS.API.CONSUMER.CREATE." + s + ".>",
		"$JS.API.CONSUMER.INFO." + s + ".*", "$JS.API.CONSUMER.MSG.NEXT." + s + ".*",
		"$JS.API.CONSUMER.DELETE." + s + ".*", ack(s), flowControl(s),
	}
}

// readKV is reading (get, watch) a bucket.
func readKV(bucket string) []string {
	s := "KV_" + bucket
	return slices.Concat([]string{streamInfo(s), msgGet(s)}, directGet(s), consumers(s))
}

// writeKV is reading and writing every key of a bucket.
func writeKV(bucket string) []string { return append(readKV(bucket), "$KV."+bucket+".>") }

// readStream is reading a stream's messages by sequence and through
// consumers (an ordered consumer for events).
func readStream(s string) []string {
	return slices.Concat([]string{streamInfo(s), msgGet(s)}, directGet(s), consumers(s))
}

func taskStreams(shards int) []string {
	out := make([]string, 0, shards)
	for i := range shards {
		out = append(out, protocol.TaskStream(i))
	}
	return out
}

// submitters are the identities whose inboxes the scheduler may answer a
// submission on (the Warden-Reply-To header).
var submitters = []string{RolePublisher, RoleAdmin, RoleAPI}

// Roles returns the fixed identities' permissions for a deployment with
// this many task shards. Every subject here is one the code uses; a test
// runs the whole life cycle with these and fails on any refusal.
func Roles(taskShards int) []Role {
	if taskShards <= 0 {
		taskShards = 4
	}
	// Submissions, on warden.submit or warden.submit.<job> only: delayed
	// ones too (the scheduler holds them in WARDEN_DELAY, a stream that
	// must allow roll-ups and so is written only by schedulers).
	submit := []string{protocol.SubjectSubmit, protocol.SubmitSubject("*")}
	base := []string{"$JS.API.INFO"}

	// Reading the deployment: jobs, presence, health, events, dead letters.
	readData := slices.Concat(base, readKV(protocol.BucketJobs), readKV(protocol.BucketPresence),
		readKV(protocol.BucketHealth), readKV(protocol.BucketClusters), readKV(protocol.BucketClusterRuntime), readStream(protocol.StreamEvents), readStream(protocol.StreamDLQ),
		// Schedules are listed by stream info and last-message gets
		// (internal/schedule Store), never through a consumer: one on
		// WARDEN_SCHEDULES could pull, ack, re-filter or delete the
		// schedulers' shared durable schedule-relay and so submit no
		// recurring job at all.
		[]string{streamInfo(streams.StreamSchedules), msgGet(streams.StreamSchedules)}, directGet(streams.StreamSchedules),
		// A duplicate submission is checked against the one it repeats
		// (pkg/client: still queued, delayed, a job, or rejected).
		[]string{msgGet(protocol.StreamSubmit), msgGet(protocol.StreamDelay)},
		// Overviews: stream names, depths, consumers of the task streams.
		[]string{"$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST", "$JS.API.STREAM.INFO.*"})
	for _, t := range taskStreams(taskShards) {
		readData = append(readData, "$JS.API.CONSUMER.LIST."+t, "$JS.API.CONSUMER.NAMES."+t, "$JS.API.CONSUMER.INFO."+t+".*")
	}
	read := slices.Clone(readData)

	// NATS micro: the read endpoints warden.ops.<process>.<group>.<op>;
	// admin endpoints have one more token
	// (warden.ops.<process>.admin.<group>.<op>) and stay out of reach.
	// Discovery ($SRV) is an operator's: the micro library answers it on
	// whatever reply subject the request names, with the answering
	// process's permissions (the job store, leases, task subjects), so a
	// reader who could send it could write through the scheduler. Warden's
	// own endpoints answer only on _INBOX. subjects.
	read = append(read, "warden.ops.*.*.*")

	// Operating it: change job records (cancel, retry), order agents,
	// supervisors and schedulers (control subjects), retry and purge dead
	// letters, submit. What the HTTP API does of it (jobs); the CLI's admin
	// adds schedules and the operator's reach (operate below).
	operateJobs := []string{
		"$KV." + protocol.BucketJobs + ".>",
		// Cluster definitions, requests, and a deleted cluster's state
		// (warden cluster ...).
		"$KV." + protocol.BucketClusters + ".>", "$KV." + protocol.BucketClusterRuntime + ".>",
		// ... and the events of a definition's change (internal/cluster
		// Store): without them each create, update or delete waited out
		// its whole timeout for a PubAck that never came.
		protocol.EventSubject(protocol.EventClusterCreated, "*"), protocol.EventSubject(protocol.EventClusterUpdated, "*"),
		protocol.EventSubject(protocol.EventClusterDeleted, "*"),
		msgDelete(protocol.StreamDLQ), "$JS.API.STREAM.PURGE." + protocol.StreamDLQ,
	}
	operate := slices.Concat(read, submit, operateJobs, []string{
		// Schedules (warden schedule add|rm): definitions and timers; rm
		// purges a schedule's subjects.
		protocol.SubjectSchedulePrefix + ".def.*", protocol.SubjectSchedulePrefix + ".timer.*",
		"$JS.API.STREAM.PURGE." + streams.StreamSchedules,
		"warden.control.>",
		"warden.ops.>", "$SRV.>",
	})
	// The HTTP API: its routes' reach only. Not discovery ($SRV: answered
	// with the answering process's permissions on any reply subject, it
	// wrote the deployment record through the scheduler), not the other
	// processes' ops endpoints, not schedules (it has no schedule routes);
	// of the control subjects, advance, failover and orders to agents.
	api := slices.Concat(readData, submit, operateJobs, []string{
		protocol.SubjectControlAdvance, protocol.SubjectControlFailover, "warden.control.agent.>",
	})

	// The deployment record (task shards, partitions) every process
	// checks at start; `warden setup` writes it, a scheduler or supervisor
	// may add a setting it lacks.
	deployment := append(readKV(protocol.BucketDeployment), "$KV."+protocol.BucketDeployment+"."+protocol.KeyDeployment)

	sched := slices.Concat(base, deployment, readKV(protocol.BucketClusters), readKV(protocol.BucketClusterRuntime),
		[]string{"$JS.API.STREAM.INFO.*"},
		consumers(protocol.StreamSubmit), consumers(protocol.StreamResults),
		writeKV(protocol.BucketJobs), readKV(protocol.BucketPresence), readKV(protocol.BucketHealth),
		[]string{protocol.SubjectTaskPrefix + ".>", protocol.SubjectEventPrefix + ".>", protocol.SubjectControlAdvance},
		// Cancel orders to agents.
		[]string{"warden.control.agent.>"},
		// Workflow: concurrency slots and rate limits at dispatch; the
		// schedule relay consumes ticks, re-arms timers and submits.
		writeKV(streams.BucketConcurrency), writeKV(streams.BucketRateLimits),
		readStream(streams.StreamSchedules),
		[]string{protocol.SubjectSchedulePrefix + ".timer.*", protocol.SubmitSubject("*"), protocol.SubjectControlGateFreed},
		// Delayed submissions: held in WARDEN_DELAY, released ones relayed.
		[]string{protocol.DelaySubject("*")}, consumers(protocol.StreamDelay),
	)
	for _, r := range submitters {
		sched = append(sched, inbox(r))
	}
	// Its micro service answers the read endpoints (ops facade).
	sched = dedupe(slices.Concat(sched, readData))

	// Clusters: a transfer reads the definition (its timeout and retries).
	sup := slices.Concat(base, deployment, readKV(protocol.BucketClusters), readKV(protocol.BucketClusterRuntime),
		writeKV(streams.BucketConcurrency), writeKV(streams.BucketRateLimits),
		[]string{"$JS.API.STREAM.INFO.*"},
		consumers(protocol.StreamAdvisories),
		writeKV(protocol.BucketJobs), readKV(protocol.BucketPresence), writeKV(protocol.BucketHealth),
		writeKV(protocol.BucketLeases),
		[]string{protocol.SubjectEventPrefix + ".>", protocol.SubjectDLQPrefix + ".>", protocol.SubjectControlAdvance,
			protocol.SubjectControlGateFreed},
		// A dead letter whose step moved on before it was marked (a result
		// won the race) is withdrawn again.
		[]string{msgDelete(protocol.StreamDLQ)},
		// Self-healing's orders to agents: limit, drain, undrain.
		[]string{"warden.control.agent.>"},
	)
	for _, s := range taskStreams(taskShards) {
		// Failover and dead-lettering read an agent's queued tasks, check
		// its consumer's real delivery counts and remove what they moved.
		sup = slices.Concat(sup, []string{msgGet(s), msgDelete(s), "$JS.API.CONSUMER.INFO." + s + ".*",
			"$JS.API.CONSUMER.LIST." + s, "$JS.API.CONSUMER.NAMES." + s}, directGet(s))
	}
	// Anchors (internal/anchor, a leader duty): store one on each work-queue
	// stream's own subject, find (by subject) and delete the ones before.
	// The task streams' gets and deletes are granted above; the submit and
	// results streams get the same (DIRECT.GET too: a stream with
	// allow_direct serves GetMsg there).
	for _, s := range taskStreams(taskShards) {
		sup = append(sup, protocol.AnchorSubject(s))
	}
	for _, s := range []string{protocol.StreamSubmit, protocol.StreamResults} {
		sup = slices.Concat(sup, []string{protocol.AnchorSubject(s), msgGet(s), msgDelete(s)}, directGet(s))
	}
	sup = dedupe(slices.Concat(sup, readData))

	return []Role{
		{Name: RoleSetup, Purpose: "`warden setup`: creates and updates streams and buckets; operators' stream administration. The only identity that may create, change or delete streams.",
			Pub: []string{"$JS.API.>", "$KV." + protocol.BucketDeployment + ".>"}, Sub: []string{inbox(RoleSetup)}},
		{Name: RoleScheduler, Purpose: "cmd/scheduler: takes submissions and results, runs the job store, dispatches tasks.",
			Pub: sched, Sub: append([]string{inbox(RoleScheduler), protocol.SubjectControlAdvance, protocol.SubjectControlGateFreed}, microService(RoleScheduler)...), Responses: true},
		{Name: RoleSupervisor, Purpose: "cmd/supervisor: leader election, lease recovery, failover, dead letters, health and healing.",
			Pub: sup, Sub: append([]string{inbox(RoleSupervisor), protocol.SubjectControlFailover}, microService(RoleSupervisor)...), Responses: true},
		{Name: RolePublisher, Purpose: "programs that submit jobs (pkg/client Submit): submit only.",
			Pub: submit, Sub: []string{inbox(RolePublisher)}},
		{Name: RoleReadonly, Purpose: "`warden` CLI for reading: jobs ls, job show/follow, agents ls, dlq ls/show, healing ls.",
			Pub: read, Sub: []string{inbox(RoleReadonly)}},
		{Name: RoleAdmin, Purpose: "`warden` CLI for operating: submit, job cancel/retry, agent drain/undrain/limit/failover, dlq retry/purge, and everything readonly does.",
			Pub: operate, Sub: []string{inbox(RoleAdmin)}},
		{Name: RoleAPI, Purpose: "`warden api` (HTTP API): what its routes do of admin's (jobs, agents, dead letters, clusters), under its own identity.",
			Pub: api, Sub: append([]string{inbox(RoleAPI)}, microService(RoleAPI)...), Responses: true},
	}
}

// Role returns the fixed identity name's permissions.
func RoleByName(name string, taskShards int) (Role, error) {
	for _, r := range Roles(taskShards) {
		if r.Name == name {
			return r, nil
		}
	}
	return Role{}, fmt.Errorf("unknown role %q (one of %v)", name, FixedRoles)
}

// Agent returns the permissions of agent <pool>.<id>: its own task consumer
// on its own shard stream, its own presence key, results and dead letters
// naming itself, its own control subject and inbox. It may not read or
// touch another agent's tasks, presence, results or replies.
func Agent(pool, id string, taskShards int) (Role, error) {
	if !protocol.ValidToken(pool) || !protocol.ValidToken(id) {
		return Role{}, fmt.Errorf("agent pool %q and id %q must be NATS tokens ([A-Za-z0-9_-], 1-128)", pool, id)
	}
	if taskShards <= 0 {
		taskShards = 4
	}
	shard := protocol.Shard(pool, id, taskShards)
	stream := protocol.TaskStream(shard)
	key := "$KV." + protocol.BucketPresence + "." + protocol.PresenceKey(pool, id)
	presence := "KV_" + protocol.BucketPresence
	identity := AgentIdentity(pool, id)
	return Role{
		Name:    identity,
		Purpose: "agent " + pool + "." + id + " (task shard " + strconv.Itoa(shard) + " of " + strconv.Itoa(taskShards) + ")",
		Pub: []string{
			"$JS.API.INFO",
			streamInfo(stream),
			// Its durable consumer, named after it, filtered on its own
			// task subject: the filter is part of the API subject, so the
			// server refuses any other filter.
			"$JS.API.CONSUMER.CREATE." + stream + "." + id + "." + protocol.TaskSubject(shard, pool, id),
			"$JS.API.CONSUMER.INFO." + stream + "." + id,
			// Deleting it re-creates it: to replace a consumer an older
			// release kept on disk, and to have ghost deliveries sent
			// again (pkg/agent/ghosts.go). The tasks stay in the stream.
			"$JS.API.CONSUMER.DELETE." + stream + "." + id,
			"$JS.API.CONSUMER.MSG.NEXT." + stream + "." + id,
			"$JS.ACK." + stream + "." + id + ".>",
			// Its presence key: write it and read it (direct gets). No
			// consumer: permissions pin a consumer's name and filter, not
			// its deliver subject, and the server would deliver what the
			// agent wrote to its key, headers and all, to any subject with
			// the stream's own rights (a drain order to every agent).
			// internal/presence reads the key instead of watching it.
			streamInfo(presence),
			key,
			"$JS.API.DIRECT.GET." + presence + "." + key,
			// The deployment record, read at start.
			streamInfo("KV_" + protocol.BucketDeployment),
			"$JS.API.DIRECT.GET.KV_" + protocol.BucketDeployment + ".$KV." + protocol.BucketDeployment + "." + protocol.KeyDeployment,
			protocol.ResultsPublishFilter(pool, id),
			protocol.DLQSubject(pool, id),
		},
		Sub:       []string{inbox(identity), protocol.AgentControlSubject(pool, id)},
		Responses: true,
	}, nil
}

// Markdown renders roles as the permissions list docs/security.md
// includes (a test keeps the two equal).
func Markdown(roles []Role) string {
	var b strings.Builder
	for _, r := range roles {
		fmt.Fprintf(&b, "#### %s\n\n%s\n\n", r.Name, r.Purpose)
		if r.Responses {
			b.WriteString("May answer requests it receives (one reply each, within a minute).\n\n")
		}
		fmt.Fprintf(&b, "```\nsubscribe:\n  %s\npublish:\n  %s\n```\n\n",
			strings.Join(r.Sub, "\n  "), strings.Join(r.Pub, "\n  "))
	}
	return b.String()
}

// DocRoles is what docs/security.md lists: the fixed roles and, as an
// example, agent default.agent-1.
func DocRoles(taskShards int) []Role {
	a, _ := Agent("default", "agent-1", taskShards)
	return append(Roles(taskShards), a)
}

// microService is what a process's NATS micro service (warden-<process>)
// subscribes to: discovery and its own endpoints.
func microService(process string) []string {
	name := "warden-" + process
	return []string{"$SRV.*", "$SRV.*." + name, "$SRV.*." + name + ".*", "warden.ops." + process + ".>"}
}

// dedupe drops repeated subjects, keeping the first.
func dedupe(in []string) []string {
	seen := map[string]bool{}
	out := in[:0:0]
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// clusterEvents are the event kinds a cluster's leader publishes.
var clusterEvents = []protocol.EventKind{
	protocol.EventClusterLeader, protocol.EventClusterFailover, protocol.EventClusterMemberJoined,
	protocol.EventClusterMemberLeft, protocol.EventClusterMemberRefused, protocol.EventClusterUnderReplicated,
	protocol.EventClusterRecovered, protocol.EventClusterRebalanced, protocol.EventClusterRequest,
}

// AgentInCluster is Agent plus what a member of cluster c needs to join
// and lead it (docs/clusters.md): read its cluster's definition; its own
// member report in c, its cluster's state, sync and request keys, the
// lease cluster.<c> (in warden_cluster_leases), a watch of its own health record, and the cluster
// events. Nothing of another cluster's keys, and no write in the
// definitions bucket: the runtime bucket allows roll-ups (pkg/protocol),
// so a member can empty that, but not lose a definition. (The event
// subjects cannot be narrowed: an event's id token is
// "<cluster>-<epoch>..." and NATS wildcards match whole tokens.)
func AgentInCluster(pool, id string, taskShards int, c string) (Role, error) {
	r, err := Agent(pool, id, taskShards)
	if err != nil || c == "" {
		return r, err
	}
	if !protocol.ValidToken(c) {
		return Role{}, fmt.Errorf("cluster %q must be a NATS token ([A-Za-z0-9_-], 1-128)", c)
	}
	def, rt := "$KV."+protocol.BucketClusters+"."+c, "$KV."+protocol.BucketClusterRuntime+"."+c
	leases, health := clusterLeaseSubject(c), "$KV."+protocol.BucketHealth+"."+protocol.PresenceKey(pool, id)
	r.Purpose += ", member of cluster " + c
	r.Pub = slices.Concat(r.Pub,
		// Its definition, read and watched: that key alone (an agent
		// outside a cluster never opens the bucket).
		watchKeys(protocol.BucketClusters, def),
		// Its cluster's runtime keys, read and watched.
		watchKeys(protocol.BucketClusterRuntime, rt+".>"),
		// Its report (internal/cluster.Member writes it with a TTL and
		// deletes it on leaving): in c alone, so that it cannot pose as a
		// member of a cluster it was not minted for.
		[]string{"$KV." + protocol.BucketClusterRuntime + "." + protocol.ClusterMemberKey(c, pool, id),
			rt + ".state", rt + ".sync", rt + ".req.*"},
		// Its cluster's lease, in a bucket of cluster leases only: the
		// supervisor's is out of reach of a member's roll-up.
		[]string{leases}, watchKeys(protocol.BucketClusterLeases, leases),
		watchKeys(protocol.BucketHealth, health),
		[]string{protocol.EventSubject(protocol.EventHealing, "*")},
	)
	for _, k := range clusterEvents {
		r.Pub = append(r.Pub, protocol.EventSubject(k, "*"))
	}
	return r, nil
}

// clusterLeaseSubject is the subject cluster c's lease is written on: a
// member's credential may publish it (AgentInCluster), and clusterOf reads
// the cluster back from it.
func clusterLeaseSubject(c string) string {
	return "$KV." + protocol.BucketClusterLeases + "." + protocol.ClusterLeaseKey(c)
}
