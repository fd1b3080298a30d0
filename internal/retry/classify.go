package retry

import (
	"regexp"
	"strings"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Classes a Decision can carry besides a rule's own class. ClassRetriable
// and ClassPermanent mean the agent said so itself.
const (
	ClassRetriable    = protocol.ClassRetriable
	ClassPermanent    = protocol.ClassPermanent
	ClassUnclassified = "unclassified"
)

// DefaultMaxRetryAfter caps the delay an agent may ask for.
const DefaultMaxRetryAfter = time.Hour

// Rule classifies an error text containing Match (case-insensitive).
type Rule struct {
	// Match is a substring of the error text, compared case-insensitively.
	Match string `yaml:"match" json:"match"`
	// Class names the failure in the step's retry chain, e.g. "quota".
	Class string `yaml:"class" json:"class"`
	// Retriable says whether a failure matching the rule is retried.
	Retriable bool `yaml:"retriable" json:"retriable"`
}

// runtimeRules match texts the agent runtime writes itself, not the
// handler. They are checked before permanentRules: pkg/agent prefixes a
// handler's error with agent.ErrDeadline ("step deadline reached") only
// when the handler's context ended because the step's deadline or timeout
// passed, so whatever the handler made of the cancellation ("...: invalid
// connection") is a consequence of the timeout, and the step is retried as
// one (see runHandler in pkg/agent/process.go). The texts it produces:
// "step deadline reached[: step timeout 30s][: <handler error>]",
// "step deadline reached: passed before the handler could start" and
// "handler did not return after cancellation: step deadline reached".
var runtimeRules = []Rule{
	{Match: "step deadline reached", Class: "timeout", Retriable: true},
}

// permanentRules are checked before retriableRules, so "invalid parameter:
// timeout must be positive" is permanent. Within a list the first match
// names the class.
var permanentRules = []Rule{
	// An expired (or not yet valid) TLS certificate: "x509: certificate has
	// expired or is not yet valid". Without this rule the retriable
	// "expired" rule below (meant for a task's queue ttl) would retry it,
	// but a certificate is renewed by an operator, not within the seconds
	// or minutes of a backoff: the retries would only delay the failure and
	// file it under the wrong class.
	{Match: "certificate has expired", Class: "certificate"},
	{Match: "unknown action", Class: "unknown_action"},
	{Match: "not allowed", Class: "not_allowed"},
	{Match: "permission denied", Class: "permission_denied"},
	{Match: "forbidden", Class: "permission_denied"},
	{Match: "unauthorized", Class: "permission_denied"},
	{Match: "not found", Class: "not_found"},
	{Match: "invalid param", Class: "invalid_params"},
	{Match: "invalid argument", Class: "invalid_params"},
	{Match: "validation", Class: "validation"},
	{Match: "invalid", Class: "validation"},
}

var retriableRules = []Rule{
	{Match: "stale heartbeat", Class: "stale_heartbeat", Retriable: true},
	{Match: "heartbeat stale", Class: "stale_heartbeat", Retriable: true},
	{Match: "lease lost", Class: "lease_lost", Retriable: true},
	{Match: "lease expired", Class: "lease_lost", Retriable: true},
	// A task's queue ttl: the agent's "expired: not started by …". Not
	// any "expired" (a session token's, a password's: an operator renews
	// those).
	{Match: "expired:", Class: "expired", Retriable: true},
	{Match: "expired in queue", Class: "expired", Retriable: true},
	{Match: "timeout", Class: "timeout", Retriable: true},
	{Match: "timed out", Class: "timeout", Retriable: true},
	{Match: "deadline exceeded", Class: "timeout", Retriable: true},
	{Match: "connection refused", Class: "connection", Retriable: true},
	{Match: "connection reset", Class: "connection", Retriable: true},
	{Match: "broken pipe", Class: "connection", Retriable: true},
	{Match: "no route to host", Class: "connection", Retriable: true},
	{Match: "network is unreachable", Class: "connection", Retriable: true},
	// The peer closed the connection mid-request (Go's http client:
	// `Get "…": EOF`, "unexpected EOF" reading a body); not the "eof"
	// inside a word (geofence).
	{Match: ": eof", Class: "connection", Retriable: true},
	{Match: "unexpected eof", Class: "connection", Retriable: true},
	{Match: "unavailable", Class: "unavailable", Retriable: true},
	{Match: "status 500", Class: "unavailable", Retriable: true},
	{Match: "status 502", Class: "unavailable", Retriable: true},
	{Match: "status 503", Class: "unavailable", Retriable: true},
	{Match: "status 504", Class: "timeout", Retriable: true},
	{Match: "too many requests", Class: "throttled", Retriable: true},
	{Match: "status 429", Class: "throttled", Retriable: true},
	{Match: "rate limit", Class: "throttled", Retriable: true},
	{Match: "temporary", Class: "temporary", Retriable: true},
	{Match: "temporarily", Class: "temporary", Retriable: true},
	{Match: "try again", Class: "temporary", Retriable: true},
	{Match: "shutting down", Class: "shutdown", Retriable: true},
}

// BuiltinRules returns the built-in rules in the order they are checked:
// the agent runtime's own texts, then the permanent rules, then the
// retriable ones.
func BuiltinRules() []Rule {
	return append(append(append([]Rule(nil), runtimeRules...), permanentRules...), retriableRules...)
}

// addressText matches the parts of an error text that name where a request
// went rather than what went wrong: URLs with a scheme (Go's url.Error
// quotes them: Post "https://x/api/validation": ...; up to a space or a
// quote, so a bracketed IPv6 host stays inside, and not a colon that ends
// them: "GET https://x/v1: EOF" keeps its ": eof"), network addresses with a
// port whose host is dotted or bracketed (dial tcp invalid.example.com:443,
// [::1]:5432), and the name in a resolver's "lookup <host>: …" or
// "lookup <host> on <server>" (not the word after any "lookup": "service
// lookup timed out" lost its "timed"). Written in lower case: it runs on
// the lowered text.
var addressText = regexp.MustCompile(
	`[a-z][a-z0-9+.-]*://[^\s"'<>` + "`" + `]*[^\s"'<>:` + "`" + `]` +
		`|\blookup\s+[^\s:]+(?::|\s+on\b)` +
		`|(?:\[[0-9a-f:.%a-z]*\]|[a-z0-9_-]+(?:\.[a-z0-9_-]+)+):[0-9]+\b`)

// withoutAddresses blanks the URLs and addresses in a lowered error text,
// so that the built-in rules match what went wrong and not where: a
// "validation" or "invalid" in a path or host name must not make a
// connection refused permanent. Dotted names without a port are kept: they
// are as often an exception's class (java.util.concurrent.TimeoutException)
// as a host.
func withoutAddresses(text string) string {
	return addressText.ReplaceAllString(text, " ")
}

// Classification configures Classify.
type Classification struct {
	// RetryUnclassified says whether a failure that carries no class and
	// matches no rule is retried. Defaults to false: permanent, the
	// conservative choice.
	RetryUnclassified bool `yaml:"retry_unclassified" json:"retry_unclassified"`
	// MaxRetryAfter caps the delay an agent asks for with retry-after.
	// Defaults to 1h.
	MaxRetryAfter protocol.Duration `yaml:"max_retry_after" json:"max_retry_after"`
	// Rules are checked before the built-in ones, in order. Defaults to none.
	Rules []Rule `yaml:"rules" json:"rules,omitempty"`
}

// DefaultClassification returns the classification defaults.
func DefaultClassification() Classification {
	return Classification{MaxRetryAfter: protocol.Duration(DefaultMaxRetryAfter)}
}

// WithDefaults fills MaxRetryAfter when zero.
func (c Classification) WithDefaults() Classification {
	if c.MaxRetryAfter == 0 {
		c.MaxRetryAfter = protocol.Duration(DefaultMaxRetryAfter)
	}
	return c
}

// Validate reports the first field that breaks a rule.
func (c Classification) Validate() error {
	if c.MaxRetryAfter <= 0 {
		return invalid("classification.max_retry_after must be positive, got %s", c.MaxRetryAfter)
	}
	for i, r := range c.Rules {
		switch {
		case strings.TrimSpace(r.Match) == "":
			return invalid("classification.rules[%d].match must not be empty", i)
		case strings.TrimSpace(r.Class) == "":
			return invalid("classification.rules[%d].class must not be empty (it names the failure in retry chains)", i)
		}
	}
	return nil
}

// Decision is the outcome of classifying a failure.
type Decision struct {
	// Retriable says whether the failure is worth another attempt.
	Retriable bool `json:"retriable"`
	// Class names the failure: ClassRetriable or ClassPermanent when the
	// agent classified it, a rule's class ("timeout", "not_found", ...)
	// when a rule matched, ClassUnclassified otherwise.
	Class string `json:"class"`
	// After is the least delay the agent asked for, capped by
	// max_retry_after; 0 when none or when the failure is permanent.
	After time.Duration `json:"after,omitempty"`
	// Match is the substring that classified the error text, if any.
	Match string `json:"match,omitempty"`
}

// Classify decides what a failure is. class is the agent's error class
// (protocol.ClassRetriable, protocol.ClassPermanent, or a common alias such
// as "transient" or "fatal"); retryAfter is the delay it asked for. An
// explicit class wins; a retry-after without a class means retriable;
// otherwise errText is matched against cfg.Rules, then the built-in rules
// (the agent runtime's deadline text, then permanent, then retriable ones);
// anything else follows cfg.RetryUnclassified.
//
// The built-in rules ignore URLs and network addresses in errText (see
// withoutAddresses); cfg.Rules see the whole text, since an operator may
// mean to match a host.
func Classify(class, errText string, retryAfter time.Duration, cfg Classification) Decision {
	after := func() time.Duration {
		if retryAfter <= 0 {
			return 0
		}
		if limit := cfg.MaxRetryAfter.Std(); limit > 0 && retryAfter > limit {
			return limit
		}
		return retryAfter
	}
	switch normaliseClass(class) {
	case ClassRetriable:
		return Decision{Retriable: true, Class: ClassRetriable, After: after()}
	case ClassPermanent:
		return Decision{Retriable: false, Class: ClassPermanent}
	}
	if retryAfter > 0 {
		return Decision{Retriable: true, Class: ClassRetriable, After: after()}
	}
	text := strings.ToLower(errText)
	if d, ok := match(cfg.Rules, text); ok {
		return d
	}
	text = withoutAddresses(text)
	for _, rules := range [][]Rule{runtimeRules, permanentRules, retriableRules} {
		if d, ok := match(rules, text); ok {
			return d
		}
	}
	return Decision{Retriable: cfg.RetryUnclassified, Class: ClassUnclassified}
}

// match returns the decision of the first rule whose text occurs in text
// (lower case).
func match(rules []Rule, text string) (Decision, bool) {
	for _, r := range rules {
		if m := strings.ToLower(strings.TrimSpace(r.Match)); m != "" && strings.Contains(text, m) {
			return Decision{Retriable: r.Retriable, Class: r.Class, Match: m}, true
		}
	}
	return Decision{}, false
}

// normaliseClass maps the class names agents in any language may send to
// ClassRetriable or ClassPermanent; anything else becomes "".
func normaliseClass(class string) string {
	c := strings.NewReplacer("-", "_", " ", "_").Replace(strings.ToLower(strings.TrimSpace(class)))
	switch c {
	case "retriable", "retryable", "transient", "retry":
		return ClassRetriable
	case "permanent", "fatal", "non_retriable", "non_retryable", "nonretriable", "nonretryable":
		return ClassPermanent
	}
	return ""
}
