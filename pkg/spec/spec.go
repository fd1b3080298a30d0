package spec

import (
	"time"

	"github.com/wardenhq/warden/internal/retry"
	"github.com/wardenhq/warden/pkg/protocol"
)

// RetryOverride is the step's retry override with max_retries folded in.
func (s Step) RetryOverride() *retry.Override {
	if s.Retry == nil && s.MaxRetries == nil {
		return nil
	}
	var o retry.Override
	if s.Retry != nil {
		o = *s.Retry
	}
	if s.MaxRetries != nil {
		o.MaxRetries = s.MaxRetries
	}
	return &o
}

// DefaultPool is the pool of a step that names none.
const DefaultPool = "default"

// Job is what a user submits.
type Job struct {
	// Name is a human label; it need not be unique.
	Name string `json:"name" yaml:"name"`
	// IdempotencyKey makes resubmissions return the same job.
	IdempotencyKey string `json:"idempotency_key,omitempty" yaml:"idempotency_key,omitempty"`
	// Steps run in dependency order; independent steps run in parallel.
	Steps []Step `json:"steps" yaml:"steps"`
	// Workflow fields (workflow.go): priority, delayed start, expiry and a
	// concurrency key for the whole job.
	Priority    Priority          `json:"priority,omitempty" yaml:"priority,omitempty"`
	RunAt       *time.Time        `json:"run_at,omitempty" yaml:"run_at,omitempty"`
	Delay       protocol.Duration `json:"delay,omitempty" yaml:"delay,omitempty"`
	ExpiresAt   *time.Time        `json:"expires_at,omitempty" yaml:"expires_at,omitempty"`
	TTL         protocol.Duration `json:"ttl,omitempty" yaml:"ttl,omitempty"`
	Concurrency *Concurrency      `json:"concurrency,omitempty" yaml:"concurrency,omitempty"`
	// Timeout bounds the whole job, from its start (its acceptance, or
	// when a delayed job comes due) to its end: past it, its pending steps
	// are cancelled, its running ones interrupted, and the job fails
	// "timed out" (its compensations, if any, run as after any failure).
	// Zero: no bound. Each step's own timeout still bounds each execution.
	Timeout protocol.Duration `json:"timeout,omitempty" yaml:"timeout,omitempty"`
	// MaxRetries and Retry are the retry settings of the steps that set
	// neither (WithJobRetry): a step's own max_retries or retry replaces
	// both, nothing is merged. Compensations keep their own.
	MaxRetries *int           `json:"max_retries,omitempty" yaml:"max_retries,omitempty"`
	Retry      *RetryOverride `json:"retry,omitempty" yaml:"retry,omitempty"`
}

// WithJobRetry returns s with the job's retry settings when it sets
// neither max_retries nor retry of its own.
func (j *Job) WithJobRetry(s Step) Step {
	if s.MaxRetries == nil && s.Retry == nil {
		s.MaxRetries, s.Retry = j.MaxRetries, j.Retry
	}
	return s
}

// Step is one unit of work run by one agent.
type Step struct {
	ID     string         `json:"id" yaml:"id"`
	Action string         `json:"action" yaml:"action"`
	Params map[string]any `json:"params,omitempty" yaml:"params,omitempty"`
	// Pool the agent is chosen from. Defaults to DefaultPool.
	Pool string `json:"pool,omitempty" yaml:"pool,omitempty"`
	// Agent pins the step to one agent of the pool.
	Agent string `json:"agent,omitempty" yaml:"agent,omitempty"`
	// Cluster sends the step through an agent cluster instead of a pool
	// (docs/clusters.md); Target names what it acts on, which picks the
	// member of a sharded cluster.
	Cluster string `json:"cluster,omitempty" yaml:"cluster,omitempty"`
	Target  string `json:"target,omitempty" yaml:"target,omitempty"`
	// Requires lists capabilities the agent must have.
	Requires  []string `json:"requires,omitempty" yaml:"requires,omitempty"`
	DependsOn []string `json:"depends_on,omitempty" yaml:"depends_on,omitempty"`
	// Timeout bounds one execution; zero means the scheduler's default.
	Timeout protocol.Duration `json:"timeout,omitempty" yaml:"timeout,omitempty"`
	// ExpiresIn, when set, is how long after submission the step may still
	// start; a step not started by then fails with reason "expired".
	ExpiresIn protocol.Duration `json:"expires_in,omitempty" yaml:"expires_in,omitempty"`
	// MaxRetries bounds re-executions after a retriable failure; nil means
	// the scheduler's default.
	MaxRetries *int `json:"max_retries,omitempty" yaml:"max_retries,omitempty"`
	// Retry overrides the action's retry policy for this step (backoff,
	// multiplier, jitter, max_retries); max_retries above wins over it.
	Retry *RetryOverride `json:"retry,omitempty" yaml:"retry,omitempty"`
	// Workflow fields (workflow.go): priority, absolute expiry (ttl is the
	// same as expires_in), a concurrency key, a named rate limit and the
	// compensation that undoes the step.
	Priority    Priority          `json:"priority,omitempty" yaml:"priority,omitempty"`
	ExpiresAt   *time.Time        `json:"expires_at,omitempty" yaml:"expires_at,omitempty"`
	TTL         protocol.Duration `json:"ttl,omitempty" yaml:"ttl,omitempty"`
	Concurrency *Concurrency      `json:"concurrency,omitempty" yaml:"concurrency,omitempty"`
	RateLimit   string            `json:"rate_limit,omitempty" yaml:"rate_limit,omitempty"`
	Compensate  *Compensation     `json:"compensate,omitempty" yaml:"compensate,omitempty"`
}

// PoolOrDefault returns the step's pool.
func (s Step) PoolOrDefault() string {
	if s.Pool == "" {
		return DefaultPool
	}
	return s.Pool
}
