package spec

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/wardenhq/warden/internal/retry"
	"github.com/wardenhq/warden/pkg/protocol"
)

// validRetry checks the retry settings of s (a step's, or the job's with
// prefix ""): max_retries 0 to 100, and a retry override that applies.
func validRetry(prefix string, s Step, fresh bool) error {
	f := func(name string) string {
		if prefix == "" {
			return name
		}
		return prefix + "." + name
	}
	if s.MaxRetries != nil && (*s.MaxRetries < 0 || *s.MaxRetries > retry.MaxMaxRetries) {
		return invalid(ReasonInvalidValue, f("max_retries"), "must be between 0 and %d, got %d", retry.MaxMaxRetries, *s.MaxRetries)
	}
	if o := s.RetryOverride(); o != nil {
		if err := validRetryDurations(f("retry"), o, fresh); err != nil {
			return err
		}
		if err := o.Apply(retry.DefaultPolicy()).Validate(); err != nil {
			return invalid(ReasonInvalidValue, f("retry"), "%v", err)
		}
	}
	return nil
}

// validIdempotencyKey refuses a key that would not reach the server as
// written. The key is the submission's Nats-Msg-Id, and NATS clients trim a
// header value's leading and trailing white space and turn CR and LF into
// spaces (nats.go does), while the job id is JobIDForKey of the key as
// written: "k\n" and "k" were one message id for the stream, which dropped
// the second as a duplicate, and two job ids, so the second submitter was
// told of an existing job that never existed.
func validIdempotencyKey(k string) error {
	if len(k) > 256 {
		return invalid(ReasonInvalidValue, "idempotency_key", "longer than 256 bytes")
	}
	if strings.TrimSpace(k) != k {
		return invalid(ReasonInvalidValue, "idempotency_key", "%q starts or ends with white space", k)
	}
	if i := strings.IndexFunc(k, unicode.IsControl); i >= 0 {
		return invalid(ReasonInvalidValue, "idempotency_key", "%q contains a control character at byte %d (tab, newline, ...)", k, i)
	}
	return nil
}

// validRequires refuses a capability no agent can offer
// (protocol.CapabilityProblem, which agents' configs are held to: an
// empty one left the step waiting for ever). The field is named only on
// an error: a step without requires costs nothing.
func validRequires(field string, requires []string) error {
	for i, c := range requires {
		if problem := protocol.CapabilityProblem(c); problem != "" {
			return invalid(ReasonInvalidValue, fmt.Sprintf("%s.requires[%d]", field, i), "required capability %q %s", c, problem)
		}
	}
	return nil
}

// Validate checks the spec against the limits. The first problem found is
// returned as a *ValidationError.
func (j *Job) Validate(l Limits) error {
	l = l.withDefaults()
	fresh := !l.Accepted
	if strings.TrimSpace(j.Name) == "" {
		return invalid(ReasonMissingField, "name", "a job needs a name")
	}
	if err := validIdempotencyKey(j.IdempotencyKey); err != nil {
		return err
	}
	if len(j.Steps) == 0 {
		return invalid(ReasonEmpty, "steps", "a job needs at least one step")
	}
	if len(j.Steps) > l.MaxSteps {
		return invalid(ReasonTooLarge, "steps", "%d steps, the limit is %d", len(j.Steps), l.MaxSteps)
	}
	index := make(map[string]int, len(j.Steps))
	for i, s := range j.Steps {
		f := fmt.Sprintf("steps[%d]", i)
		if s.ID == "" {
			return invalid(ReasonMissingField, f+".id", "a step needs an id")
		}
		if !protocol.ValidToken(s.ID) {
			return invalid(ReasonInvalidID, f+".id", "%q may contain only letters, digits, '_' and '-'", s.ID)
		}
		if prev, dup := index[s.ID]; dup {
			return invalid(ReasonDuplicateStep, f+".id", "step id %q is also used by steps[%d]", s.ID, prev)
		}
		index[s.ID] = i
		if s.Action == "" {
			return invalid(ReasonMissingField, f+".action", "step %q needs an action", s.ID)
		}
		if !protocol.ValidToken(s.Action) {
			return invalid(ReasonInvalidID, f+".action", "action %q may contain only letters, digits, '_' and '-'", s.Action)
		}
		if s.Pool != "" && !protocol.ValidToken(s.Pool) {
			return invalid(ReasonInvalidID, f+".pool", "pool %q may contain only letters, digits, '_' and '-'", s.Pool)
		}
		if s.Agent != "" && !protocol.ValidToken(s.Agent) {
			return invalid(ReasonInvalidID, f+".agent", "agent %q may contain only letters, digits, '_' and '-'", s.Agent)
		}
		if err := validRequires(f, s.Requires); err != nil {
			return err
		}
		if s.Cluster != "" && !protocol.ValidToken(s.Cluster) {
			return invalid(ReasonInvalidID, f+".cluster", "cluster %q may contain only letters, digits, '_' and '-'", s.Cluster)
		}
		if s.Cluster != "" && (s.Pool != "" || s.Agent != "") {
			return invalid(ReasonInvalidValue, f+".cluster", "a step goes to a cluster or to a pool/agent, not both")
		}
		if s.Target != "" && (s.Cluster == "" || strings.ContainsAny(s.Target, " \t\r\n")) {
			return invalid(ReasonInvalidValue, f+".target", "target %q needs a cluster and no white space", s.Target)
		}
		if err := validRetry(f, s, fresh); err != nil {
			return err
		}
		if err := validDuration(f+".timeout", s.Timeout, fresh); err != nil {
			return err
		}
	}
	// The job's retry settings, as the steps that take them would hold them.
	if err := validRetry("", Step{MaxRetries: j.MaxRetries, Retry: j.Retry}, fresh); err != nil {
		return err
	}
	for i, s := range j.Steps {
		seen := map[string]bool{}
		for _, d := range s.DependsOn {
			f := fmt.Sprintf("steps[%d].depends_on", i)
			if d == s.ID {
				return invalid(ReasonCycle, f, "step %q depends on itself", s.ID)
			}
			if _, ok := index[d]; !ok {
				return invalid(ReasonMissingDependency, f, "step %q depends on %q, which is not a step of this job", s.ID, d)
			}
			if seen[d] {
				return invalid(ReasonInvalidValue, f, "step %q lists %q twice", s.ID, d)
			}
			seen[d] = true
		}
	}
	if cycle := j.findCycle(index); cycle != nil {
		return invalid(ReasonCycle, "depends_on", "steps form a cycle: %s", strings.Join(cycle, " -> "))
	}
	return j.validateWorkflow(fresh)
}

// findCycle returns one dependency cycle as a path of step ids, or nil.
func (j *Job) findCycle(index map[string]int) []string {
	const (
		unvisited = iota
		visiting
		done
	)
	state := make([]int, len(j.Steps))
	var stack []string
	var visit func(i int) []string
	visit = func(i int) []string {
		state[i] = visiting
		stack = append(stack, j.Steps[i].ID)
		for _, d := range j.Steps[i].DependsOn {
			k := index[d]
			switch state[k] {
			case visiting:
				// The cycle is the stack from d's position to the top, then d.
				for p, id := range stack {
					if id == d {
						return append(append([]string{}, stack[p:]...), d)
					}
				}
			case unvisited:
				if c := visit(k); c != nil {
					return c
				}
			}
		}
		stack = stack[:len(stack)-1]
		state[i] = done
		return nil
	}
	for i := range j.Steps {
		if state[i] == unvisited {
			if c := visit(i); c != nil {
				return c
			}
		}
	}
	return nil
}

// Step returns the step with id, or false.
func (j *Job) Step(id string) (Step, bool) {
	for _, s := range j.Steps {
		if s.ID == id {
			return s, true
		}
	}
	return Step{}, false
}
