package protocol

// EventKind names what an event reports; it is the <kind> token of the
// event's subject, warden.event.<kind>.<id>. The kinds are part of the
// protocol: consumers filter on them, so a kind is never renamed.
type EventKind string

// String returns the kind as it appears in subjects and JSON.
func (k EventKind) String() string { return string(k) }

// Event kinds about jobs, steps and agents (cluster kinds: cluster.go).
const (
	// EventSubmissionRejected: a submission was not accepted (its Reason
	// says why; Data["reason"] is a spec.Reason* code when it was invalid).
	EventSubmissionRejected EventKind = "submission_rejected"
	// EventStaleResult: a result for an older dispatch (epoch, token or
	// agent do not match the step's) was dropped.
	EventStaleResult EventKind = "stale_result"
	// EventResultRejected: a result that could not be used (undecodable,
	// unknown job or step) was dropped.
	EventResultRejected EventKind = "result_rejected"
	// EventResultFieldsIgnored: a result was applied without optional
	// fields that did not decode (Data["fields"] names them, Reason says
	// why; the step, agent and Data["epoch"] say whose).
	EventResultFieldsIgnored EventKind = "result_fields_ignored"
	// EventStepFailedUnknownLimit: a step failed because no scheduler that
	// held it knew its rate limit for the grace (Data["rate_limit"]).
	EventStepFailedUnknownLimit EventKind = "step_failed_unknown_rate_limit"
	// EventStepRecovered: the supervisor took a step back from its agent
	// (lease expired, agent failed) for a scheduler to dispatch again.
	EventStepRecovered EventKind = "step_recovered"
	// EventAgentFailed: an agent's presence ended (stopped or expired).
	EventAgentFailed EventKind = "agent_failed"
	// EventFailover: an agent's queued tasks were moved to others.
	EventFailover EventKind = "failover"
	// EventDeadLettered: a step was parked in WARDEN_DLQ
	// (Data["reason"] is a DLQReason).
	EventDeadLettered EventKind = "dead_lettered"
	// EventHealing: the supervisor assessed an agent and acted on it.
	EventHealing EventKind = "healing"
)

// DLQReason says why a task was dead-lettered (header Warden-DLQ-Reason).
type DLQReason string

// Dead-letter reasons.
const (
	// DLQMaxDeliveries: the task was delivered max_deliver times without
	// an answer (the consumer's max-deliveries advisory).
	DLQMaxDeliveries DLQReason = "max_deliveries"
	// DLQPoison: the step was taken back from its agents poison_threshold
	// times.
	DLQPoison DLQReason = "poison"
	// DLQUndecodable: an agent could not decode the task.
	DLQUndecodable DLQReason = "undecodable"
	// DLQExpired: the task's deadline passed before it ran or reported.
	DLQExpired DLQReason = "expired"
	// DLQTransferTimeout: a step moved off a failed cluster member was not
	// taken up by another member within the cluster's
	// task_transfer_timeout, max_transfer_retries times over.
	DLQTransferTimeout DLQReason = "transfer_timeout"
)

// RejectReason says why a result was dropped (event result_rejected,
// data.reason). A rejected result changes nothing.
type RejectReason string

// Result rejection reasons.
const (
	// RejectUndecodable: the body is not a JSON Result.
	RejectUndecodable RejectReason = "undecodable"
	// RejectSubjectMismatch: the subject is not a result subject, or names
	// another agent, job or step than the body.
	RejectSubjectMismatch RejectReason = "subject_mismatch"
	// RejectBadStatus: the status is neither succeeded nor failed.
	RejectBadStatus RejectReason = "bad_status"
	// RejectUnknownJob: no such job.
	RejectUnknownJob RejectReason = "unknown_job"
	// RejectUnknownStep: the job has no such step.
	RejectUnknownStep RejectReason = "unknown_step"
	// RejectWrongAgent: the step is held by another agent.
	RejectWrongAgent RejectReason = "wrong_agent"
	// RejectWrongToken: the result does not carry the dispatch's lease token.
	RejectWrongToken RejectReason = "wrong_token"
)
