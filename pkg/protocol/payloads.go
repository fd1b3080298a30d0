package protocol

import (
	"encoding/json"
	"time"
)

// Task is the body of a message on a task subject. Headers repeat the routing
// fields so a consumer can decide without decoding the body.
type Task struct {
	JobID    string          `json:"job_id"`
	StepID   string          `json:"step_id"`
	Epoch    uint64          `json:"epoch"`
	Attempt  int             `json:"attempt"`
	Action   string          `json:"action"`
	Params   json.RawMessage `json:"params,omitempty"`
	Timeout  Duration        `json:"timeout"`
	Deadline time.Time       `json:"deadline"`
	// ExpiresAt, when set, is when the task stops being worth running: an
	// agent that gets it later reports it failed with reason "expired".
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Token is this dispatch's lease token; the result must echo it.
	Token string `json:"token"`
}

// Result statuses.
const (
	ResultSucceeded = "succeeded"
	ResultFailed    = "failed"
)

// Error classes an agent may put in a failed result. An empty class lets the
// scheduler classify the error message.
const (
	ClassRetriable = "retriable"
	ClassPermanent = "permanent"
)

// Result is the body of a message on a result subject.
type Result struct {
	JobID  string `json:"job_id"`
	StepID string `json:"step_id"`
	Epoch  uint64 `json:"epoch"`
	// Token echoes the task's lease token: a result without it is refused.
	Token  string          `json:"token"`
	Agent  string          `json:"agent"`
	Pool   string          `json:"pool"`
	Status string          `json:"status"`
	Output json.RawMessage `json:"output,omitempty"`
	// Truncated says the agent cut Output (and Error) to stay within its
	// max_result_bytes; Output then holds {"truncated": true,
	// "original_bytes": n, "head": "<the start of the output>"}.
	Truncated  bool      `json:"truncated,omitempty"`
	Error      string    `json:"error,omitempty"`
	ErrorClass string    `json:"error_class,omitempty"`
	RetryAfter Duration  `json:"retry_after,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
}

// Presence is an agent's heartbeat, stored under <pool>.<agent> in the
// presence bucket. The bucket's TTL removes it when heartbeats stop.
type Presence struct {
	ID            string            `json:"id"`
	Pool          string            `json:"pool"`
	Capabilities  []string          `json:"capabilities,omitempty"`
	Actions       []string          `json:"actions,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	MaxConcurrent int               `json:"max_concurrent"`
	InFlight      int               `json:"in_flight"`
	Succeeded     uint64            `json:"succeeded"`
	Failed        uint64            `json:"failed"`
	Version       string            `json:"version"`
	Host          string            `json:"host"`
	PID           int               `json:"pid"`
	Draining      bool              `json:"draining,omitempty"`
	TaskStream    string            `json:"task_stream"`
	TaskSubject   string            `json:"task_subject"`
	StartedAt     time.Time         `json:"started_at"`
	HeartbeatAt   time.Time         `json:"heartbeat_at"`
	// Cluster names the agent cluster the agent is a member of, if any.
	Cluster string `json:"cluster,omitempty"`
	// Consumer is the agent's durable task consumer on TaskStream: its id.
	// Readers check it (protocol.ValidatePresence) and never use another.
	Consumer string `json:"consumer,omitempty"`
	// HeartbeatInterval is how often the agent heartbeats; health judges
	// its regularity against it.
	HeartbeatInterval Duration `json:"heartbeat_interval,omitempty"`
	// QueueDepth is how many tasks wait for the agent on its consumer, as
	// of its last fetch (the pending count of the last task delivered), or,
	// while it is held back and not fetching, of its consumer's info.
	QueueDepth int `json:"queue_depth,omitempty"`
	// Utilisation is the agent's resource utilisation, 0..1: the busiest of
	// its CPU use (process and finished children, of the CPUs it may use;
	// the Go SDK smooths it over about 5 s) and, under a memory limit,
	// memory.
	// Absent: not reported.
	Utilisation *float64 `json:"utilisation,omitempty"`
	// Health is the agent's own view of its health, 0..1 (1: well).
	// Absent: not reported.
	Health *float64 `json:"health,omitempty"`
}

// Control is an order to one agent on its AgentControlSubject.
type Control struct {
	// Op is one of the Control* ops.
	Op string `json:"op"`
	// JobID, StepID and Epoch name the task a cancel is about.
	JobID  string `json:"job_id,omitempty"`
	StepID string `json:"step_id,omitempty"`
	Epoch  uint64 `json:"epoch,omitempty"`
	// Token, on a cancel, is the dispatch's lease token when the sender
	// knows it (a scheduler does): an agent that keeps a cancel for a
	// dispatch not running yet applies it to that dispatch only.
	Token string `json:"token,omitempty"`
	// Value is the new limit of a ControlLimit.
	Value int `json:"value,omitempty"`
}

// Control ops.
const (
	// ControlCancel cancels the named task's handler; the step ends cancelled.
	ControlCancel = "cancel"
	// ControlDrain stops taking new tasks; in-flight ones finish.
	ControlDrain = "drain"
	// ControlUndrain takes tasks again.
	ControlUndrain = "undrain"
	// ControlLimit sets how many tasks the agent runs at once (Value, at
	// most its configured max_concurrent; 0 restores that).
	ControlLimit = "limit"
)

// ErrorCancelled starts the error of a result whose step was cancelled.
const ErrorCancelled = "cancelled"

// SubmitReply is published to a submission's Warden-Reply-To subject.
type SubmitReply struct {
	JobID string `json:"job_id,omitempty"`
	// Existing is true when the job already existed (same idempotency key).
	Existing bool   `json:"existing,omitempty"`
	Error    string `json:"error,omitempty"`
}

// Event is the body of a message on an event subject.
type Event struct {
	Kind   EventKind         `json:"kind"`
	ID     string            `json:"id"`
	Time   time.Time         `json:"time"`
	JobID  string            `json:"job_id,omitempty"`
	StepID string            `json:"step_id,omitempty"`
	Agent  string            `json:"agent,omitempty"`
	Reason string            `json:"reason,omitempty"`
	Data   map[string]string `json:"data,omitempty"`
}

// Event kinds: events.go.
