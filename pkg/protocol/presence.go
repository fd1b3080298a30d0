package protocol

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
)

// EventPresenceRejected: a presence record was not used because it does
// not describe its own key's agent (Data["reason"] is a PresenceReject*
// code, Data["key"] the record's key).
const EventPresenceRejected EventKind = "presence_rejected"

// Reasons a presence record is rejected (PresenceError.Reason).
const (
	// PresenceRejectKey: the key is not <pool>.<id> of the record, or the
	// pool or id is not a valid token.
	PresenceRejectKey = "key_mismatch"
	// PresenceRejectTaskSubject: task_subject is not the agent's own
	// warden.task.<shard>.<pool>.<id>.
	PresenceRejectTaskSubject = "task_subject_mismatch"
	// PresenceRejectTaskStream: task_stream is not the agent's shard's
	// stream.
	PresenceRejectTaskStream = "task_stream_mismatch"
	// PresenceRejectConsumer: consumer is set and is not the agent's id
	// (its durable consumer's name).
	PresenceRejectConsumer = "consumer_mismatch"
)

// ErrPresenceRejected is wrapped by every PresenceError.
var ErrPresenceRejected = errors.New("presence rejected")

// PresenceError says why a presence record was rejected.
type PresenceError struct {
	Key    string
	Reason string // a PresenceReject* code
	Detail string
}

func (e *PresenceError) Error() string {
	return fmt.Sprintf("presence %s rejected (%s): %s", e.Key, e.Reason, e.Detail)
}

func (e *PresenceError) Unwrap() error { return ErrPresenceRejected }

// ValidatePresence checks that a presence record stored under key names
// exactly what its agent's pool and id derive: the key <pool>.<id>, the
// task subject TaskSubject(Shard(pool, id, shards), pool, id), the stream
// TaskStream of that shard, and (when set) the consumer <id>. shards is
// the deployment's task shard count; 0 (unknown) accepts any shard as long
// as subject and stream name the same one. A record that fails is never to
// be used to route tasks, select the agent or fail it over.
func ValidatePresence(key string, p Presence, shards int) error {
	reject := func(reason, format string, args ...any) error {
		return &PresenceError{Key: key, Reason: reason, Detail: fmt.Sprintf(format, args...)}
	}
	if !ValidToken(p.Pool) || !ValidToken(p.ID) || key != PresenceKey(p.Pool, p.ID) {
		return reject(PresenceRejectKey, "key %q does not name pool %q and id %q", key, p.Pool, p.ID)
	}
	shard := -1
	if shards > 0 {
		shard = Shard(p.Pool, p.ID, shards)
	} else if n, ok := subjectShard(p.TaskSubject); ok {
		shard = n
	}
	if want := TaskSubject(shard, p.Pool, p.ID); shard < 0 || p.TaskSubject != want {
		if shard < 0 {
			want = TaskSubject(0, p.Pool, p.ID) + " (any shard)"
		}
		return reject(PresenceRejectTaskSubject, "task_subject %q, want %s", p.TaskSubject, want)
	}
	if want := TaskStream(shard); p.TaskStream != want {
		return reject(PresenceRejectTaskStream, "task_stream %q, want %s", p.TaskStream, want)
	}
	if p.Consumer != "" && p.Consumer != p.ID {
		return reject(PresenceRejectConsumer, "consumer %q, want %s", p.Consumer, p.ID)
	}
	return nil
}

// subjectShard reads the shard of warden.task.<shard>.<pool>.<id>.
func subjectShard(subject string) (int, bool) {
	rest, ok := strings.CutPrefix(subject, SubjectTaskPrefix+".")
	if !ok {
		return 0, false
	}
	tok, _, _ := strings.Cut(rest, ".")
	n, err := strconv.Atoi(tok)
	if err != nil || n < 0 || strconv.Itoa(n) != tok {
		return 0, false
	}
	return n, true
}

// Routed returns p with TaskStream, TaskSubject and Consumer set to what
// its pool and id derive for a deployment of shards task shards: the
// record ValidatePresence accepts (for hand-made records and tests).
func (p Presence) Routed(shards int) Presence {
	shard := Shard(p.Pool, p.ID, shards)
	p.TaskStream, p.TaskSubject, p.Consumer = TaskStream(shard), TaskSubject(shard, p.Pool, p.ID), p.ID
	return p
}

// CapabilityProblem says why c cannot be a capability, or "": one is
// not empty, has no white space at either end and no control character.
// Agents' configs and steps' requires are held to the same rule, so that
// no step requires a capability no agent can offer (a NUL would also
// merge two sets of requirements in the scheduler's slot classes).
func CapabilityProblem(c string) string {
	switch {
	case strings.TrimSpace(c) == "":
		return "must not be empty"
	case strings.TrimSpace(c) != c:
		return "starts or ends with white space"
	case strings.IndexFunc(c, unicode.IsControl) >= 0:
		return "contains a control character"
	}
	return ""
}
