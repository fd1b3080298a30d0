package spec

import (
	"fmt"
	"time"

	"github.com/wardenhq/warden/internal/retry"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Priority orders work under backlog: higher priorities are dispatched and
// taken first. The empty priority is PriorityNormal.
type Priority string

// Priorities, lowest first.
const (
	PriorityLow      Priority = "low"
	PriorityNormal   Priority = "normal"
	PriorityHigh     Priority = "high"
	PriorityCritical Priority = "critical"
)

// Priorities lists every priority, lowest first.
var Priorities = []Priority{PriorityLow, PriorityNormal, PriorityHigh, PriorityCritical}

// Rank is 0 (low) to 3 (critical); the empty priority ranks as normal and
// an unknown one as -1.
func (p Priority) Rank() int {
	switch p {
	case PriorityLow:
		return 0
	case "", PriorityNormal:
		return 1
	case PriorityHigh:
		return 2
	case PriorityCritical:
		return 3
	}
	return -1
}

// RankOrNormal is p's rank, with an unknown priority (a record written
// by a newer version) ranked as normal: every ordering by priority reads
// it so, the scheduler's and the concurrency limiter's alike.
func (p Priority) RankOrNormal() int {
	if r := p.Rank(); r >= 0 {
		return r
	}
	return PriorityNormal.Rank()
}

// OrDefault returns p, or PriorityNormal when p is empty.
func (p Priority) OrDefault() Priority {
	if p == "" {
		return PriorityNormal
	}
	return p
}

// Concurrency caps how many steps holding Key run at once, system-wide.
type Concurrency struct {
	// Key names the group, e.g. "customer-42": letters, digits, '_', '-'.
	Key string `json:"key" yaml:"key"`
	// Limit is how many steps with the key may run at once (1 to 1000).
	Limit int `json:"limit" yaml:"limit"`
}

// Compensation is what undoes a step that succeeded, run when its job fails
// permanently or is cancelled with compensation. It runs as a step of its
// own (fenced, leased, retried), on the step's pool unless it names one.
type Compensation struct {
	Action     string            `json:"action" yaml:"action"`
	Params     map[string]any    `json:"params,omitempty" yaml:"params,omitempty"`
	Pool       string            `json:"pool,omitempty" yaml:"pool,omitempty"`
	Agent      string            `json:"agent,omitempty" yaml:"agent,omitempty"`
	Requires   []string          `json:"requires,omitempty" yaml:"requires,omitempty"`
	Timeout    protocol.Duration `json:"timeout,omitempty" yaml:"timeout,omitempty"`
	MaxRetries *int              `json:"max_retries,omitempty" yaml:"max_retries,omitempty"`
	Retry      *RetryOverride    `json:"retry,omitempty" yaml:"retry,omitempty"`
}

// CompensationSuffix ends the id of a step's compensation step.
const CompensationSuffix = "_compensate"

// CompensationID is the id of the compensation step of step id.
func CompensationID(step string) string { return step + CompensationSuffix }

// maxDelay bounds delay, run_at and ttl: a year ahead. It bounds every
// other duration of a spec too (validDuration): expires_in (ttl's older
// name), timeouts and retry backoffs, which the scheduler adds to times
// and to other durations (a timeout plus the dispatch grace is a lease):
// unbounded, a valid duration such as 2562047h overflows those sums.
const maxDelay = 366 * 24 * time.Hour

// validDuration checks a duration of the spec: 0 to maxDelay. Decoding
// refuses negative durations already; a Job built in Go may still hold one.
// A fresh spec's (not Limits.Accepted) is also at least 1 ms: a JSON number
// is read as nanoseconds ("timeout": 60 was 60ns: the job timed out at once
// and compensated), while YAML refuses one.
func validDuration(field string, d protocol.Duration, fresh bool) error {
	switch {
	case d < 0:
		return invalid(ReasonInvalidValue, field, "must not be negative, got %s", d)
	case d.Std() > maxDelay:
		return invalid(ReasonInvalidValue, field, "at most %s, got %s", maxDelay, d)
	case fresh && d > 0 && d.Std() < time.Millisecond:
		return invalid(ReasonInvalidValue, field, "at least 1ms, got %s (a JSON number is nanoseconds: write a duration such as \"60s\")", d)
	}
	return nil
}

// validRetryDurations bounds the backoffs a retry override sets; the
// retry package checks the rest (positive, max_backoff >= base_backoff).
func validRetryDurations(field string, o *retry.Override, fresh bool) error {
	if o.BaseBackoff != nil {
		if err := validDuration(field+".base_backoff", *o.BaseBackoff, fresh); err != nil {
			return err
		}
	}
	if o.MaxBackoff != nil {
		return validDuration(field+".max_backoff", *o.MaxBackoff, fresh)
	}
	return nil
}

// StartAt is when a job submitted at submitted may start: run_at, or
// submitted + delay, or the zero time (at once).
func (j *Job) StartAt(submitted time.Time) time.Time {
	switch {
	case j.RunAt != nil:
		return *j.RunAt
	case j.Delay > 0:
		return submitted.Add(j.Delay.Std())
	}
	return time.Time{}
}

// ExpiryAt is when a job expires if it has not started: expires_at, or
// ttl after due (when it is materialised: at submission, or when a
// delayed job is released), or the zero time (never).
func (j *Job) ExpiryAt(due time.Time) time.Time {
	switch {
	case j.ExpiresAt != nil:
		return *j.ExpiresAt
	case j.TTL > 0:
		return due.Add(j.TTL.Std())
	}
	return time.Time{}
}

// StepExpiryAt is when step s of j, materialised at due, expires if it has
// not started: the earliest of the step's expires_at, ttl (or expires_in)
// and the job's expiry; the zero time means never.
func (j *Job) StepExpiryAt(s Step, due time.Time) time.Time {
	var at time.Time
	earliest := func(t time.Time) {
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	if s.ExpiresAt != nil {
		earliest(*s.ExpiresAt)
	}
	if d := max(s.TTL, s.ExpiresIn); d > 0 {
		earliest(due.Add(d.Std()))
	}
	earliest(j.ExpiryAt(due))
	return at
}

// StepPriority is the priority step s runs at: its own, else the job's,
// else normal.
func (j *Job) StepPriority(s Step) Priority {
	if s.Priority != "" {
		return s.Priority
	}
	return j.Priority.OrDefault()
}

// StepConcurrency lists the concurrency keys step s must hold to run: the
// job's key (shared by all its steps) and the step's own.
func (j *Job) StepConcurrency(s Step) []Concurrency {
	var out []Concurrency
	if j.Concurrency != nil {
		out = append(out, *j.Concurrency)
	}
	if s.Concurrency != nil && (j.Concurrency == nil || s.Concurrency.Key != j.Concurrency.Key) {
		out = append(out, *s.Concurrency)
	}
	return out
}

// validateWorkflow checks the workflow fields; Validate has checked ids
// and dependencies already.
// usesWorkflow reports whether the step sets any of the fields
// validateWorkflow checks.
func (s *Step) usesWorkflow() bool {
	return s.Priority != "" || s.TTL != 0 || s.ExpiresIn != 0 || s.ExpiresAt != nil ||
		s.Concurrency != nil || s.RateLimit != "" || s.Compensate != nil
}

func (j *Job) validateWorkflow(fresh bool) error {
	if err := validPriority("priority", j.Priority); err != nil {
		return err
	}
	if j.RunAt != nil && j.Delay > 0 {
		return invalid(ReasonInvalidValue, "run_at", "set run_at or delay, not both")
	}
	if err := validDuration("delay", j.Delay, fresh); err != nil {
		return err
	}
	if j.ExpiresAt != nil && j.TTL > 0 {
		return invalid(ReasonInvalidValue, "expires_at", "set expires_at or ttl, not both")
	}
	if err := validDuration("ttl", j.TTL, fresh); err != nil {
		return err
	}
	if err := validDuration("timeout", j.Timeout, fresh); err != nil {
		return err
	}
	if j.RunAt != nil && j.ExpiresAt != nil && !j.ExpiresAt.After(*j.RunAt) {
		return invalid(ReasonInvalidValue, "expires_at", "the job would expire (%s) before it may start (run_at %s)",
			j.ExpiresAt.Format(time.RFC3339), j.RunAt.Format(time.RFC3339))
	}
	// maxDelay bounds run_at as it bounds delay. Only a time ahead is
	// bounded: a spec validated again later (a delayed job when it is
	// released) is never refused for this.
	if j.RunAt != nil {
		if limit := time.Now().Add(maxDelay); j.RunAt.After(limit) {
			return invalid(ReasonInvalidValue, "run_at", "at most %s ahead, that is until %s, got %s",
				maxDelay, limit.UTC().Format(time.RFC3339), j.RunAt.Format(time.RFC3339))
		}
	}
	if err := validConcurrency("concurrency", j.Concurrency); err != nil {
		return err
	}
	var ids map[string]bool // the job's step ids, for compensations only
	for i, s := range j.Steps {
		if !s.usesWorkflow() {
			// Most steps: nothing to check here, and nothing allocated
			// (field paths are built only for steps that need them).
			continue
		}
		if s.Compensate != nil && ids == nil {
			ids = make(map[string]bool, len(j.Steps))
			for _, o := range j.Steps {
				ids[o.ID] = true
			}
		}
		f := fmt.Sprintf("steps[%d]", i)
		if err := validPriority(f+".priority", s.Priority); err != nil {
			return err
		}
		if s.TTL > 0 && s.ExpiresIn > 0 {
			return invalid(ReasonInvalidValue, f+".ttl", "set ttl or expires_in (its older name), not both")
		}
		if s.ExpiresAt != nil && max(s.TTL, s.ExpiresIn) > 0 {
			return invalid(ReasonInvalidValue, f+".expires_at", "set expires_at or ttl, not both")
		}
		if err := validDuration(f+".ttl", s.TTL, fresh); err != nil {
			return err
		}
		// expires_in is ttl by its older name: the same bound.
		if err := validDuration(f+".expires_in", s.ExpiresIn, fresh); err != nil {
			return err
		}
		if err := validConcurrency(f+".concurrency", s.Concurrency); err != nil {
			return err
		}
		if s.RateLimit != "" && !protocol.ValidToken(s.RateLimit) {
			return invalid(ReasonInvalidID, f+".rate_limit", "rate limit name %q may contain only letters, digits, '_' and '-'", s.RateLimit)
		}
		if c := s.Compensate; c != nil {
			if err := validCompensation(f+".compensate", s.ID, c, ids, fresh); err != nil {
				return err
			}
		}
	}
	return nil
}

func validPriority(field string, p Priority) error {
	if p.Rank() < 0 {
		return invalid(ReasonInvalidValue, field, "%q is not a priority: use low, normal, high or critical", string(p))
	}
	return nil
}

func validConcurrency(field string, c *Concurrency) error {
	if c == nil {
		return nil
	}
	if c.Key == "" {
		return invalid(ReasonMissingField, field+".key", "a concurrency limit needs a key")
	}
	if !protocol.ValidToken(c.Key) {
		return invalid(ReasonInvalidID, field+".key", "%q may contain only letters, digits, '_' and '-'", c.Key)
	}
	// At most 1000: a key's holders share one KV value (internal/concurrency)
	// that must fit a message.
	if c.Limit < 1 || c.Limit > 1000 {
		return invalid(ReasonInvalidValue, field+".limit", "must be between 1 and 1000, got %d", c.Limit)
	}
	return nil
}

func validCompensation(field, step string, c *Compensation, ids map[string]bool, fresh bool) error {
	if c.Action == "" {
		return invalid(ReasonMissingField, field+".action", "the compensation of step %q needs an action", step)
	}
	if !protocol.ValidToken(c.Action) {
		return invalid(ReasonInvalidID, field+".action", "action %q may contain only letters, digits, '_' and '-'", c.Action)
	}
	if c.Pool != "" && !protocol.ValidToken(c.Pool) {
		return invalid(ReasonInvalidID, field+".pool", "pool %q may contain only letters, digits, '_' and '-'", c.Pool)
	}
	if c.Agent != "" && !protocol.ValidToken(c.Agent) {
		return invalid(ReasonInvalidID, field+".agent", "agent %q may contain only letters, digits, '_' and '-'", c.Agent)
	}
	if err := validRequires(field, c.Requires); err != nil {
		return err
	}
	if err := validRetry(field, Step{MaxRetries: c.MaxRetries, Retry: c.Retry}, fresh); err != nil {
		return err
	}
	if err := validDuration(field+".timeout", c.Timeout, fresh); err != nil {
		return err
	}
	id := CompensationID(step)
	if !protocol.ValidToken(id) {
		return invalid(ReasonInvalidID, field, "step id %q is too long to name its compensation %q", step, id)
	}
	if ids[id] {
		return invalid(ReasonDuplicateStep, field, "step %q's compensation would be named %q, which is another step's id", step, id)
	}
	return nil
}

// CompensationStep is the step that runs c for step s: same pool, agent
// and requirements (or cluster and target) unless c names its own pool
// (another one: then none of the step's requirements) or agent, the same priority, concurrency key and rate limit, no
// dependencies (the planner orders compensations). A cluster step's undo
// goes through its cluster to the member that owns its target, fenced
// like the step: without them it went to the default pool, to any agent
// or none.
func (s Step) CompensationStep() (Step, bool) {
	c := s.Compensate
	if c == nil {
		return Step{}, false
	}
	out := Step{
		ID: CompensationID(s.ID), Action: c.Action, Params: c.Params,
		Pool: s.Pool, Agent: s.Agent, Requires: s.Requires, Cluster: s.Cluster, Target: s.Target,
		Timeout: c.Timeout, MaxRetries: c.MaxRetries, Retry: c.Retry,
		Priority: s.Priority, Concurrency: s.Concurrency, RateLimit: s.RateLimit,
	}
	if c.Pool != "" || c.Agent != "" {
		out.Cluster, out.Target = "", "" // runs where c says, outside the cluster
	}
	if c.Pool != "" {
		out.Pool, out.Agent = c.Pool, c.Agent
		if c.Pool != s.PoolOrDefault() {
			// Another pool's agents are not the forward step's: its
			// requirements stayed on the undo, which then matched no
			// agent there and left the job compensating for ever.
			out.Requires = nil
		}
	} else if c.Agent != "" {
		out.Agent = c.Agent
	}
	if c.Requires != nil {
		out.Requires = c.Requires
	}
	return out, true
}

// EffectiveRank is the rank a priority competes at after waiting for
// waited: one level higher for every aging that passed, up to critical's.
// This is the guard against starvation: under a steady stream of higher
// priority work a low step waits at most 3 × aging before it competes as
// critical (ties go to the step that waited longest). aging <= 0 turns
// aging off.
func (p Priority) EffectiveRank(waited, aging time.Duration) int {
	r := p.RankOrNormal()
	if aging > 0 && waited > 0 {
		r += int(waited / aging)
	}
	return min(r, PriorityCritical.Rank())
}
