package protocol

// Headers on tasks, results and submissions. Values are plain strings; epochs
// and attempts are decimal, times are RFC 3339 with nanoseconds in UTC.
const (
	HeaderMsgID = "Nats-Msg-Id"

	// HeaderJob and HeaderStep name the step a task or result is about.
	HeaderJob  = "Warden-Job"
	HeaderStep = "Warden-Step"
	// HeaderEpoch is the dispatch epoch; results must echo it.
	HeaderEpoch = "Warden-Epoch"
	// HeaderToken is the dispatch's lease token (also in the task body);
	// results echo it in the body.
	HeaderToken = "Warden-Token"
	// HeaderAttempt counts executions of the step, starting at 1.
	HeaderAttempt = "Warden-Attempt"
	// HeaderDeadline is when the step's lease ends: the agent must have
	// reported by then and must stop working after it.
	HeaderDeadline = "Warden-Deadline"
	// HeaderAction is the action a task asks for.
	HeaderAction = "Warden-Action"
	// HeaderAgent names the agent that produced a result.
	HeaderAgent = "Warden-Agent"
	// HeaderRecoveries counts how often the step was taken back from an
	// agent (lease expired, agent failed); agents run such tasks alone.
	HeaderRecoveries = "Warden-Recoveries"
	// HeaderTransferredFrom names the agent a task was moved away from.
	HeaderTransferredFrom = "Warden-Transferred-From"

	// Dead-letter headers, added to the original task's headers.
	HeaderDLQReason     = "Warden-DLQ-Reason"     // max_deliveries, poison, undecodable, expired
	HeaderDLQDetail     = "Warden-DLQ-Detail"     // human explanation
	HeaderDLQDeliveries = "Warden-DLQ-Deliveries" // delivery count when moved
	HeaderDLQLastError  = "Warden-DLQ-Last-Error" // the step's last error
	HeaderDLQStream     = "Warden-DLQ-Stream"     // where the task was
	HeaderDLQStreamSeq  = "Warden-DLQ-Stream-Seq"
	HeaderDLQTime       = "Warden-DLQ-Time"

	// HeaderJobID lets a submitter choose the job id (a valid token).
	HeaderJobID = "Warden-Job-Id"
	// HeaderReplyTo asks the scheduler to publish the submission's outcome
	// (a SubmitReply) to this subject, typically an _INBOX.
	HeaderReplyTo = "Warden-Reply-To"

	// Job-store record headers. Every write to the job store carries them so
	// that listings and the supervisor's recovery scan read headers only
	// (a headers-only consumer) instead of decoding every record.
	//
	// HeaderRecordState is the record's state: the job's state on job.<id>,
	// the step's on step.<job>.<step>.
	HeaderRecordState = "Warden-State"
	// HeaderRecordLockedUntil is the earliest lease end (RFC 3339 nano) of
	// the dispatched steps the record holds; absent when none is dispatched.
	HeaderRecordLockedUntil = "Warden-Locked-Until"
	// HeaderRecordCreated is when the job was accepted (RFC 3339 nano).
	HeaderRecordCreated = "Warden-Created"
	// HeaderRecordDesired is the job's desired state on job.<id>.
	HeaderRecordDesired = "Warden-Desired"
	// HeaderRecordDeadline is when an unfinished job's timeout runs out
	// (RFC 3339 nano), on job.<id>; absent once it is being cancelled.
	HeaderRecordDeadline = "Warden-Deadline"
)
