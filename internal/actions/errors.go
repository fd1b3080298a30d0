package actions

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// PermanentError is an error that retrying cannot fix: bad parameters, a
// command that is not allowed. pkg/agent reports it with error class
// "permanent".
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// ErrorClass marks the error as not retriable.
func (e *PermanentError) ErrorClass() string { return "permanent" }

// Permanentf returns a *PermanentError with a formatted message (%w works).
func Permanentf(format string, args ...any) error {
	return &PermanentError{Err: fmt.Errorf(format, args...)}
}

// ErrInvalidParams is wrapped by every parameter decoding error.
var ErrInvalidParams = errors.New("invalid params")

// Decode decodes params into v strictly: unknown fields and trailing data
// are errors. Empty params decode as {}. Every error is permanent and wraps
// ErrInvalidParams.
func Decode(params json.RawMessage, v any) error {
	if len(bytes.TrimSpace(params)) == 0 || bytes.Equal(bytes.TrimSpace(params), []byte("null")) {
		params = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(params))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Permanentf("%w: %s", ErrInvalidParams, describe(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Permanentf("%w: trailing data after the JSON object", ErrInvalidParams)
	}
	return nil
}

// describe turns encoding/json errors into messages that name the field.
func describe(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return fmt.Sprintf("field %q must be %s, not %s", typeErr.Field, typeErr.Type, typeErr.Value)
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return "unknown field " + f
	}
	return strings.TrimPrefix(msg, "json: ")
}

// required returns a permanent error naming field when value is empty.
func required(field, value string) error {
	if value == "" {
		return Permanentf("%w: field %q is required", ErrInvalidParams, field)
	}
	return nil
}
