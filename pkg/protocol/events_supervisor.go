package protocol

// Event kinds of the supervisor leader beside those in events.go.
const (
	// EventStepCancelled: a dispatched step of a job being cancelled ended
	// cancelled when its lease ended or its agent failed, its agent never
	// having confirmed the cancel; it is not dispatched again.
	EventStepCancelled EventKind = "step_cancelled"
	// EventAdvisoryRejected: a JetStream advisory (max deliveries) did not
	// match what the server says of the message and its consumer; nothing
	// was dead-lettered. Data: type, stream, stream_seq, deliveries.
	EventAdvisoryRejected EventKind = "advisory_rejected"
)
