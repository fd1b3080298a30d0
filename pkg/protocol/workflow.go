package protocol

// Workflow protocol (issue 13): delayed submissions, recurring schedules
// and the events of schedules, expiry and compensation. See
// docs/protocol.md, "Delayed and recurring jobs".

const (
	// SubjectDelayPrefix: the scheduler holds a submission that starts
	// later on warden.delay.<job> in WARDEN_DELAY, with the JetStream
	// message-schedule headers
	//	Nats-Schedule: @at <RFC 3339 time>
	//	Nats-Schedule-Target: warden.delayed.<job>
	// The server releases it onto warden.delayed.<job> at that time,
	// headers and body intact, and a scheduler's delay relay submits it
	// again on warden.submit.<job> (HeaderReleased set). Only schedulers
	// write WARDEN_DELAY: a stream with message schedules must allow
	// roll-ups, and a publisher's "Nats-Rollup: all" would purge it.
	SubjectDelayPrefix = "warden.delay"
	// SubjectDelayedPrefix: released delayed submissions, warden.delayed.<job>.
	SubjectDelayedPrefix = "warden.delayed"
	// StreamDelay holds delayed submissions and their releases.
	StreamDelay = "WARDEN_DELAY"
	// HeaderReleased marks a submission a delay relay released: it is due,
	// and never delayed again.
	HeaderReleased = "Warden-Released"

	// SubjectSchedulePrefix prefixes the WARDEN_SCHEDULES stream:
	//	warden.schedule.def.<name>    a schedule's definition (JSON)
	//	warden.schedule.timer.<name>  a message schedule (@at) that fires the next tick
	//	warden.schedule.tick.<name>   a fired tick, relayed to warden.submit.<name>-<unix>
	SubjectSchedulePrefix = "warden.schedule"

	// HeaderSchedule names the schedule a submission or tick comes from.
	HeaderSchedule = "Warden-Schedule"
	// HeaderScheduleTick is the tick's time (RFC 3339 nano): when it was
	// due, whenever it is handled.
	HeaderScheduleTick = "Warden-Schedule-Tick"
	// HeaderScheduleAfter, on a timer the relay armed after relaying a
	// tick, is that tick's time: a tick delivered again at or before it
	// (a relay consumer created again delivers each schedule's last tick)
	// was relayed already.
	HeaderScheduleAfter = "Warden-Schedule-After"
	// HeaderScheduleRev is the stream sequence of the definition a timer
	// was armed for; a tick of a removed or replaced definition is dropped.
	HeaderScheduleRev = "Warden-Schedule-Rev"

	// SubjectControlGateFreed tells every scheduler (plain publish, no
	// queue group) that a concurrency slot was freed for the job in the
	// body: the scheduler that owns the job dispatches its waiting step
	// now; the others ignore it.
	SubjectControlGateFreed = "warden.control.gate_freed"

	// Message-schedule headers of nats-server 2.12+.
	HeaderNatsSchedule       = "Nats-Schedule"
	HeaderNatsScheduleTarget = "Nats-Schedule-Target"
	HeaderNatsScheduler      = "Nats-Scheduler"
)

// DelaySubject is where a submission of job waits until its time.
func DelaySubject(job string) string { return SubjectDelayPrefix + "." + job }

// DelayedSubject is where the server releases a delayed submission of job.
func DelayedSubject(job string) string { return SubjectDelayedPrefix + "." + job }

// ScheduleDefSubject, ScheduleTimerSubject and ScheduleTickSubject are a
// schedule's subjects in WARDEN_SCHEDULES.
func ScheduleDefSubject(name string) string   { return SubjectSchedulePrefix + ".def." + name }
func ScheduleTimerSubject(name string) string { return SubjectSchedulePrefix + ".timer." + name }
func ScheduleTickSubject(name string) string  { return SubjectSchedulePrefix + ".tick." + name }

// Workflow event kinds.
const (
	// EventScheduleFired: a schedule's tick was submitted as a job.
	EventScheduleFired EventKind = "schedule_fired"
	// EventScheduleSkipped: a tick missed while nothing could handle it
	// was skipped (catch-up policy skip).
	EventScheduleSkipped EventKind = "schedule_skipped"
	// EventJobCompensating: a job failed for good and its compensation
	// steps (Data["plan"]: the steps undone, in order) started.
	EventJobCompensating EventKind = "job_compensating"
	// EventJobCompensationEnded: the compensation of a job ended
	// (Data["state"]: compensated or compensation_failed).
	EventJobCompensationEnded EventKind = "job_compensation_ended"
	// EventStepExpired: a step was not started by its expires_at (ttl) and
	// ended expired, never run late.
	EventStepExpired EventKind = "step_expired"
)
