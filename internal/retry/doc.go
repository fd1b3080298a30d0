// Package retry decides whether a failed step is tried again and when.
//
// It owns two pure decisions, both free of clocks and I/O:
//
//   - Classification (Classify, Config.Decide): is a failure worth retrying? An
//     explicit class from the agent wins (the Go SDK's typed errors, or
//     error_class in another language's result payload); otherwise the error
//     text is matched against rules: the operator's own rules first, then the
//     Go SDK's deadline text ("step deadline reached": a timeout, whatever
//     the handler's error after it says), then the built-in permanent
//     patterns (validation, permission denied, not found, invalid
//     parameters, expired certificate ...), then the built-in retriable ones
//     (timeouts, connection refused/reset, unavailable, temporary, stale
//     heartbeat, queue expiry ...). The built-in rules ignore URLs and
//     network addresses in the text, so a "validation" in a request's path
//     does not make a refused connection permanent. Anything else follows
//     Classification.RetryUnclassified, false by default: an unknown failure
//     is permanent, the conservative choice.
//   - Backoff (Policy.Delay, Policy.Next): retry n (0 for the first retry)
//     waits min(base_backoff × multiplier^n, max_backoff) scaled by a factor
//     drawn uniformly from [1 − jitter, 1 + jitter]. The randomness is
//     injected, so tests and callers decide where it comes from. A delay the
//     agent asked for (retry-after) is a lower bound, itself capped by
//     max_retry_after.
//
// Policies are set per action and overridden per step (Policies.Resolve);
// configs/retry.yaml writes out every default.
package retry
