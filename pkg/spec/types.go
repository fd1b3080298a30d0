package spec

import "github.com/wardenhq/warden/internal/retry"

// RetryOverride is a step's own retry policy (Step.Retry): each field set
// replaces the scheduler's policy for the step's action (configs/retry.yaml):
// max_retries, base_backoff, multiplier, max_backoff, jitter.
type RetryOverride = retry.Override
