package spec

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// Limits bound what a spec may contain.
type Limits struct {
	// MaxBytes is the largest encoded spec accepted. Defaults to 256 KiB.
	MaxBytes int
	// MaxSteps is the largest number of steps. Defaults to 1000.
	MaxSteps int
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
		if dec.More() {
			return nil, invalid(ReasonMalformed, "", "trailing data after the JSON object")
		}
	} else {
		dec := yaml.NewDecoder(bytes.NewReader(trimmed))
		dec.KnownFields(true)
		if err := dec.Decode(&j); err != nil && !errors.Is(err, io.EOF) {
			return nil, decodeError(err)
		}
	}
	if err := j.Validate(l); err != nil {
		return nil, err
	}
	return &j, nil
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
