package spec

import (
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/retry"
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
	Retry *retry.Override `json:"retry,omitempty" yaml:"retry,omitempty"`
}

// PoolOrDefault returns the step's pool.
func (s Step) PoolOrDefault() string {
	if s.Pool == "" {
		return DefaultPool
	}
	return s.Pool
}
