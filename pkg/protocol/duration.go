package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"gopkg.in/yaml.v3"
)

// Duration is a time.Duration written as a Go duration string ("30s") in JSON
// and YAML, so specs and payloads stay readable. JSON numbers are accepted as
// nanoseconds. Decoding refuses negative durations, in either form.
type Duration time.Duration

// Std returns the value as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes the duration as a string. A duration's string has
// only digits, '.', '-' and unit letters (µ is valid UTF-8), none of which
// JSON escapes, so it is quoted as it is.
func (d Duration) MarshalJSON() ([]byte, error) {
	s := d.String()
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), nil
}

// UnmarshalJSON reads a duration string or a number of nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	// Every task and step record carries a duration: a quoted string
	// without escapes is read without a second JSON decoder (a stray quote
	// inside fails to parse as a duration); escapes take the long way.
	if n := len(b); n >= 2 && b[0] == '"' && b[n-1] == '"' && bytes.IndexByte(b[1:n-1], '\\') < 0 {
		return d.parse(string(b[1 : n-1]))
	}
	var v SignedDuration
	if err := v.UnmarshalJSON(b); err != nil {
		return err
	}
	// As for a string ("-1s"): no duration here means a time back.
	if v < 0 {
		return fmt.Errorf("invalid duration %s: negative", b)
	}
	*d = Duration(v)
	return nil
}

// UnmarshalYAML reads a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var v SignedDuration
	if err := v.UnmarshalYAML(n); err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("invalid duration %q: negative", v)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

func (d *Duration) parse(s string) error {
	v, err := parseDuration(s)
	if err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("invalid duration %q: negative", s)
	}
	*d = Duration(v)
	return nil
}

// parseDuration reads a Go duration string; "" is 0.
func parseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: %w", s, err)
	}
	return v, nil
}

// SignedDuration is a Duration that may be negative, for the settings
// where a negative value means something: the scheduler's retention (-1s
// keeps finished jobs forever) and the supervisor's anchor_interval (-1s
// turns anchors off). It is written as Duration is; specs and payloads use
// Duration, which refuses negative values.
type SignedDuration time.Duration

// Std returns the value as a time.Duration.
func (d SignedDuration) Std() time.Duration { return time.Duration(d) }

func (d SignedDuration) String() string { return time.Duration(d).String() }

// MarshalJSON writes the duration as a string ("-1s").
func (d SignedDuration) MarshalJSON() ([]byte, error) { return Duration(d).MarshalJSON() }

// UnmarshalJSON reads a duration string or a number of nanoseconds, either
// of which may be negative (Duration's decoding, less its refusal).
func (d *SignedDuration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if err2 := json.Unmarshal(b, &n); err2 != nil {
			return fmt.Errorf("duration must be a string like \"30s\": %w", err)
		}
		*d = SignedDuration(n)
		return nil
	}
	v, err := parseDuration(s)
	*d = SignedDuration(v)
	return err
}

// UnmarshalYAML reads a duration string, which may be negative.
func (d *SignedDuration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: duration must be a string like \"30s\"", n.Line)
	}
	v, err := parseDuration(s)
	*d = SignedDuration(v)
	return err
}

// MarshalYAML writes the duration as a string.
func (d SignedDuration) MarshalYAML() (any, error) { return d.String(), nil }
