package protocol

import (
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
)

// Subjects and stream names. They are part of the public protocol: changing
// one breaks deployed agents.
const (
	// SubjectSubmit is where publishers send job specs (stream WARDEN_SUBMIT).
	SubjectSubmit = "warden.submit"
	// SubjectResultPrefix prefixes results: warden.result.<job>.<step>.
	SubjectResultPrefix = "warden.result"
	// SubjectTaskPrefix prefixes tasks: warden.task.<shard>.<pool>.<agent>.
	SubjectTaskPrefix = "warden.task"
	// SubjectEventPrefix prefixes events: warden.event.<kind>.<id>.
	SubjectEventPrefix = "warden.event"
	// SubjectDLQPrefix prefixes dead letters: warden.dlq.<pool>.<agent>.
	SubjectDLQPrefix = "warden.dlq"
	// SubjectControlAdvance asks a scheduler (request-reply, queue group
	// "scheduler") to advance the job named in the body now.
	SubjectControlAdvance = "warden.control.advance"
	// SubjectControlFailover asks the supervisor leader (request-reply) to
	// fail over the agent whose presence key (<pool>.<agent>) is the body.
	SubjectControlFailover = "warden.control.failover"

	StreamSubmit  = "WARDEN_SUBMIT"
	StreamResults = "WARDEN_RESULTS"
	StreamEvents  = "WARDEN_EVENTS"
	StreamDLQ     = "WARDEN_DLQ"
	// StreamAdvisories keeps the task streams' max-deliveries and
	// termination advisories until the supervisor leader handles them.
	StreamAdvisories = "WARDEN_ADVISORIES"
	// StreamTasksPrefix is followed by the shard number: WARDEN_TASKS_0 ...
	StreamTasksPrefix = "WARDEN_TASKS_"

	BucketJobs     = "warden_jobs"
	BucketPresence = "warden_presence"
	BucketLeases   = "warden_leases"
	// BucketHealth holds the supervisor leader's assessment of each agent.
	BucketHealth = "warden_health"

	// ConsumerScheduler is the durable consumer all schedulers share on
	// WARDEN_SUBMIT and WARDEN_RESULTS.
	ConsumerScheduler = "scheduler"
)

// tokenRE is what a pool, agent, job or step id may contain: one NATS subject
// token that is also a valid KV key token.
var tokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// ValidToken reports whether s can be used as an id in subjects and KV keys.
func ValidToken(s string) bool { return tokenRE.MatchString(s) }

// Shard returns the task shard of an agent: FNV-1a (32 bit) of "<pool>.<agent>"
// modulo shards. Any client can compute it.
func Shard(pool, agent string, shards int) int {
	if shards <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(pool + "." + agent))
	return int(h.Sum32() % uint32(shards))
}

// TaskStream names the stream of a shard.
func TaskStream(shard int) string { return StreamTasksPrefix + strconv.Itoa(shard) }

// TaskStreamSubjects is the subject filter a task shard stream captures.
func TaskStreamSubjects(shard int) string {
	return fmt.Sprintf("%s.%d.>", SubjectTaskPrefix, shard)
}

// TaskSubject is the subject tasks for one agent are published on.
func TaskSubject(shard int, pool, agent string) string {
	return fmt.Sprintf("%s.%d.%s.%s", SubjectTaskPrefix, shard, pool, agent)
}

// ResultSubject is the subject an agent reports a step's result on.
func ResultSubject(job, step string) string {
	return SubjectResultPrefix + "." + job + "." + step
}

// EventSubject is the subject of an event of a kind about an id.
func EventSubject(kind, id string) string {
	return SubjectEventPrefix + "." + kind + "." + id
}

// DLQSubject is the subject a dead letter of an agent is stored under.
func DLQSubject(pool, agent string) string {
	return SubjectDLQPrefix + "." + pool + "." + agent
}

// AgentControlSubject is where an agent takes orders (request-reply, body a
// Control): cancel a running step, drain, undrain.
func AgentControlSubject(pool, agent string) string {
	return "warden.control.agent." + pool + "." + agent
}

// PresenceKey is an agent's key in the presence bucket.
func PresenceKey(pool, agent string) string { return pool + "." + agent }

// JobKey is a job's key in the job store.
func JobKey(job string) string { return "job." + job }

// StepKey is a step's key in the job store.
func StepKey(job, step string) string { return "step." + job + "." + step }

// StepKeysFilter matches every step key of a job.
func StepKeysFilter(job string) string { return "step." + job + ".*" }

// TaskMsgID is the Nats-Msg-Id of a dispatch: a republish of the same epoch is
// deduplicated by the stream.
func TaskMsgID(job, step string, epoch uint64) string {
	return fmt.Sprintf("%s.%s.%d", job, step, epoch)
}

// ResultMsgID is the Nats-Msg-Id of a result.
func ResultMsgID(job, step string, epoch uint64) string {
	return fmt.Sprintf("%s.%s.%d.result", job, step, epoch)
}

// Submission protocol (see docs/protocol.md):
//   - Publish the spec (YAML or JSON) to SubjectSubmit as a JetStream publish;
//     the PubAck is the durable acceptance.
//   - Set HeaderJobID to choose the job id; with an idempotency key use
//     JobIDForKey(key) and set HeaderMsgID to the key, so the stream drops a
//     resubmission inside its duplicate window and the scheduler returns the
//     existing job outside it.
//   - Set HeaderReplyTo to an inbox to receive a SubmitReply: the job id, or
//     the validation error. The scheduler derives the job id the same way
//     when the header is missing.
