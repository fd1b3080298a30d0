package spec

import (
	"errors"
	"fmt"
)

// Reasons name why a spec was rejected; they are stable and machine readable.
const (
	ReasonMalformed         = "malformed"
	ReasonUnknownField      = "unknown_field"
	ReasonTooLarge          = "too_large"
	ReasonEmpty             = "empty"
	ReasonMissingField      = "missing_field"
	ReasonInvalidID         = "invalid_id"
	ReasonDuplicateStep     = "duplicate_step"
	ReasonMissingDependency = "missing_dependency"
	ReasonCycle             = "cycle"
	ReasonInvalidValue      = "invalid_value"
	ReasonUnknownAction     = "unknown_action"
)

// ErrInvalid matches every *ValidationError with errors.Is.
var ErrInvalid = errors.New("invalid job spec")

// ValidationError says why a spec was rejected. Reason is one of the Reason
// constants; Field locates the problem (e.g. "steps[2].depends_on").
type ValidationError struct {
	Reason string
	Field  string
	Msg    string
}

func (e *ValidationError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("invalid job spec: %s: %s", e.Reason, e.Msg)
	}
	return fmt.Sprintf("invalid job spec: %s: %s: %s", e.Reason, e.Field, e.Msg)
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

func invalid(reason, field, format string, args ...any) *ValidationError {
	return &ValidationError{Reason: reason, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// ReasonOf returns the reason of a validation error, or "" if err is not one.
func ReasonOf(err error) string {
	var ve *ValidationError
	if errors.As(err, &ve) {
		return ve.Reason
	}
	return ""
}
