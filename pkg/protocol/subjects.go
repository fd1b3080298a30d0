package protocol

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// Subjects and stream names. They are part of the public protocol: changing
// one breaks deployed agents.
const (
	// SubjectSubmit is where publishers send job specs (stream WARDEN_SUBMIT)
	// without naming the job: the scheduler derives the id from the
	// Warden-Job-Id header, the idempotency key or the stream sequence.
	// Prefer SubmitSubject(job): it lets one scheduler own the job from
	// submission to its end.
	SubjectSubmit = "warden.submit"
	// SubjectResultPrefix prefixes results:
	// warden.result.<pool>.<agent>.<job>.<step>. The agent's identity is in
	// the subject so that the server can refuse a result an agent publishes
	// in another agent's name (each agent may publish only under its own
	// warden.result.<pool>.<agent>.>).
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
	// SubjectAnchorPrefix prefixes the anchor of each work-queue stream:
	// warden.anchor.<stream>. No consumer takes it; see AnchorSubject.
	SubjectAnchorPrefix = "warden.anchor"
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

// MaxTokenLen is the longest pool, agent, job or step id.
const MaxTokenLen = 128

// ValidToken reports whether s can be used as an id in subjects and KV keys:
// 1 to MaxTokenLen of A-Z, a-z, 0-9, '_' and '-', one NATS subject token
// that is also a valid KV key token. A loop, not a regexp: the scheduler
// and every agent check several ids per task, and the regexp was 3 % of
// the scheduler's CPU at full load (docs/performance.md, session 11).
func ValidToken(s string) bool {
	if len(s) == 0 || len(s) > MaxTokenLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenByte[s[i]] {
			return false
		}
	}
	return true
}

// ValidKVKey reports whether key is a key jetstream writes (nats.go's
// keyValid): letters, digits and "-/_=.", no empty token. Checked before
// a key is used as a subject (a raw read of "a.*" would read another key)
// or where a refused key would be retried for ever.
func ValidKVKey(key string) bool {
	if key == "" || key[0] == '.' || key[len(key)-1] == '.' || strings.Contains(key, "..") {
		return false
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; !tokenByte[c] && !strings.ContainsRune("/=.", rune(c)) {
			return false
		}
	}
	return true
}

// tokenByte marks the bytes an id may contain.
var tokenByte = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-'
	}
	return t
}()

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

// ResultSubject is the subject agent <pool>.<agent> reports a step's
// result on.
func ResultSubject(pool, agent, job, step string) string {
	return SubjectResultPrefix + "." + pool + "." + agent + "." + job + "." + step
}

// ResultsPublishFilter is what an agent may publish results on.
func ResultsPublishFilter(pool, agent string) string {
	return SubjectResultPrefix + "." + pool + "." + agent + ".>"
}

// SubmitSubject is where a publisher submits the job with this id. The
// stream maps it into the job's partition (see StoredSubmitFilter and SubmitTransform).
func SubmitSubject(job string) string { return SubjectSubmit + "." + job }

// Partition returns a job's scheduler partition: the one NATS's
// {{partition(n,...)}} subject mapping computes for the job id token
// (FNV-1a, 32 bit, modulo n). One scheduler at a time owns a partition.
func Partition(job string, partitions int) int {
	if partitions <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(job))
	return int(h.Sum32() % uint32(partitions))
}

// Stored subjects: the submit and results streams rewrite the subjects
// above (a stream subject transform) to carry the job's partition first, so
// that each scheduler partition is one consumer filter.
//
//	warden.submit.<job>                        → warden.submit.<p>.<job>
//	warden.result.<pool>.<agent>.<job>.<step>  → warden.result.<p>.<pool>.<agent>.<job>.<step>
//
// A submission on the bare warden.submit is stored as it is and taken by
// whichever scheduler is free.

// StoredSubmitFilter is the filter of partition p's submissions.
func StoredSubmitFilter(p int) string { return SubjectSubmit + "." + strconv.Itoa(p) + ".*" }

// StoredResultFilter is the filter of partition p's results.
func StoredResultFilter(p int) string { return SubjectResultPrefix + "." + strconv.Itoa(p) + ".>" }

// SubmitTransform and ResultTransform are the streams' subject transforms
// for n partitions (source, destination).
func SubmitTransform(n int) (string, string) {
	return SubjectSubmit + ".*", fmt.Sprintf("%s.{{partition(%d,1)}}.{{wildcard(1)}}", SubjectSubmit, max(n, 1))
}

// ResultTransform: see SubmitTransform.
func ResultTransform(n int) (string, string) {
	return SubjectResultPrefix + ".*.*.*.*", fmt.Sprintf(
		"%s.{{partition(%d,3)}}.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{wildcard(4)}}", SubjectResultPrefix, max(n, 1))
}

// AnchorSubject is the subject of a work-queue stream's anchor: one message
// the supervisor leader keeps as the stream's newest, which no consumer
// takes, so that acks never empty the stream's last file block
// (docs/protocol.md, "Anchors").
func AnchorSubject(stream string) string { return SubjectAnchorPrefix + "." + stream }

// EventSubject is the subject of an event of a kind about an id.
func EventSubject(kind EventKind, id string) string {
	return SubjectEventPrefix + "." + string(kind) + "." + id
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

// ResultMsgID is the Nats-Msg-Id of a result. It includes the dispatch's
// lease token, which only the scheduler and the agent holding the task
// know, so that nobody can take the genuine result's dedup id first.
func ResultMsgID(job, step string, epoch uint64, token string) string {
	return fmt.Sprintf("%s.%s.%d.%s", job, step, epoch, token)
}

// NewLeaseToken returns a fresh unguessable lease token (128 random bits,
// hex): every dispatch carries one and its result must echo it.
func NewLeaseToken() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("crypto/rand: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// Submission protocol (see docs/protocol.md):
//   - Publish the spec (YAML or JSON) to SubmitSubject(job) (or the bare
//     SubjectSubmit) as a JetStream publish;
//     the PubAck is the durable acceptance.
//   - Set HeaderJobID to choose the job id; with an idempotency key use
//     JobIDForKey(key) and set HeaderMsgID to the key, so the stream drops a
//     resubmission inside its duplicate window and the scheduler returns the
//     existing job outside it.
//   - Set HeaderReplyTo to an inbox to receive a SubmitReply: the job id, or
//     the validation error. The scheduler derives the job id the same way
//     when the header is missing.

// InboxRoot is the root of every subject a Warden process answers on.
const InboxRoot = "_INBOX."

// ValidReplySubject reports whether a process may answer on s: a subject
// under InboxRoot with no empty token, no wildcard and no white space. The
// requester chooses a reply subject (a message's reply, the
// Warden-Reply-To header) and the answer goes out with the answering
// process's own permissions, which reach the job store, task subjects and
// leases: an answer on anything but an inbox would be a write the
// requester could not make itself.
func ValidReplySubject(s string) bool {
	if len(s) <= len(InboxRoot) || s[:len(InboxRoot)] != InboxRoot || len(s) > 1024 {
		return false
	}
	prev := byte('.')
	for i := len(InboxRoot); i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.' && prev == '.', c <= ' ', c == 0x7f:
			return false
		case (c == '*' || c == '>') && prev == '.' && (i+1 == len(s) || s[i+1] == '.'):
			return false
		}
		prev = c
	}
	return prev != '.'
}
