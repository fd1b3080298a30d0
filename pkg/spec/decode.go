package spec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// Limits bound what a spec may contain.
type Limits struct {
	// MaxBytes is the largest encoded spec accepted. Defaults to 256 KiB
	// (0 or less). Configurations check their own values (the scheduler
	// refuses a negative max_steps at start), so no setting means the
	// default by accident.
	// It bounds the spec as submitted, a YAML spec with its aliases
	// expanded, and the spec encoded as JSON as the scheduler stores it.
	MaxBytes int
	// MaxSteps is the largest number of steps. Defaults to 1000 (0 or
	// less).
	MaxSteps int
	// Accepted says the spec was accepted before (a delayed submission
	// released, a stored schedule definition): the input checks added
	// since it may have been (each key once and in lower case, nothing
	// after a JSON object, durations of at least 1 ms) are not applied,
	// so an upgrade does not reject at its start a job it had accepted.
	Accepted bool
}

// DefaultLimits are used where no limits are configured.
var DefaultLimits = Limits{MaxBytes: 256 << 10, MaxSteps: 1000}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultLimits.MaxBytes
	}
	if l.MaxSteps <= 0 {
		l.MaxSteps = DefaultLimits.MaxSteps
	}
	return l
}

// Parse decodes a spec in JSON (first non-space byte '{') or YAML, rejecting
// unknown fields, then validates it.
//
// A spec Parse accepts is one the scheduler can store: its params are
// JSON values (YAML's non-string map keys are written as strings, .nan and
// .inf are refused) and the spec encoded as JSON, as the job store encodes
// it, is within l.MaxBytes, as is a YAML spec with its aliases expanded.
func Parse(b []byte, l Limits) (*Job, error) {
	l = l.withDefaults()
	if len(b) > l.MaxBytes {
		return nil, invalid(ReasonTooLarge, "", "spec is %d bytes, the limit is %d", len(b), l.MaxBytes)
	}
	var j Job
	trimmed := bytes.TrimSpace(b)
	if len(trimmed) == 0 {
		return nil, invalid(ReasonEmpty, "", "spec is empty")
	}
	if trimmed[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&j); err != nil {
			return nil, decodeError(err)
		}
		// More is false before a stray '}' or ']': read the next token
		// instead, which only the end of the input answers with io.EOF.
		if _, err := dec.Token(); !l.Accepted && !errors.Is(err, io.EOF) {
			return nil, invalid(ReasonMalformed, "", "trailing data after the JSON object")
		}
		if !l.Accepted {
			if err := checkKeys(trimmed); err != nil {
				return nil, err
			}
		}
		// JSON params are JSON values already: no normalising.
	} else {
		if err := decodeYAML(trimmed, l, &j); err != nil {
			return nil, err
		}
		if err := j.normaliseParams(); err != nil {
			return nil, err
		}
	}
	if err := j.Validate(l); err != nil {
		return nil, err
	}
	if err := j.checkStorable(l); err != nil {
		return nil, err
	}
	return &j, nil
}

// decodeYAML decodes the one document of a YAML spec into j.
func decodeYAML(b []byte, l Limits, j *Job) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	err := dec.Decode(&boundedJob{j: j, limit: l.MaxBytes})
	switch {
	case errors.Is(err, io.EOF):
		// No document at all (comments only): Validate says what is missing.
		return nil
	case err != nil:
		var ve *ValidationError
		if errors.As(err, &ve) {
			return ve // from boundedJob
		}
		return decodeError(err)
	}
	// A YAML stream may hold several documents; the decoder reads one at a
	// time, so the ones after the first would be silently dropped. A
	// further document that is empty (a trailing "---", as some tools
	// write) carries nothing and is let through.
	for {
		var extra yaml.Node
		err := dec.Decode(&extra)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil || !emptyDocument(&extra) {
			line := ""
			if err == nil {
				line = fmt.Sprintf(" (the second starts at line %d)", extra.Line)
			}
			return invalid(ReasonMalformed, "", "the YAML holds more than one document%s: a spec is one document, remove the \"---\" separator or submit each job on its own", line)
		}
	}
}

// emptyDocument reports whether a document node holds nothing: no node,
// or a null.
func emptyDocument(doc *yaml.Node) bool {
	return len(doc.Content) == 0 ||
		len(doc.Content) == 1 && doc.Content[0].Kind == yaml.ScalarNode && doc.Content[0].Tag == "!!null"
}

var (
	jsonUnknownRE = regexp.MustCompile(`unknown field "([^"]+)"`)
	yamlUnknownRE = regexp.MustCompile(`field (\S+) not found in type`)
)

// decodeError turns a decoder's error into a ValidationError. The decoders
// only report unknown fields as text, so this is the one place text is read.
func decodeError(err error) error {
	msg := err.Error()
	if m := jsonUnknownRE.FindStringSubmatch(msg); m != nil {
		return invalid(ReasonUnknownField, m[1], "unknown field %q", m[1])
	}
	if m := yamlUnknownRE.FindStringSubmatch(msg); m != nil {
		return invalid(ReasonUnknownField, m[1], "unknown field %q (%s)", m[1], strings.TrimPrefix(msg, "yaml: "))
	}
	return invalid(ReasonMalformed, "", "%s", msg)
}
