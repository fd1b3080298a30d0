package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"

	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/spec"
)

// ReasonOutcomeUnknown refines timeout: a submission the server may have
// stored (its publish got no answer, client.ErrOutcomeUnknown);
// ErrorDetail.JobID names the job.
const ReasonOutcomeUnknown = "outcome_unknown"

// ErrorBody is the one error shape of the API (docs/api.md#errors).
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail says what went wrong.
type ErrorDetail struct {
	// Code is stable (ops.Codes); match on it, not on Message.
	Code ops.Code `json:"code"`
	// Message is for people.
	Message string `json:"message"`
	// Status repeats the HTTP status.
	Status int `json:"status"`
	// Reason refines invalid_argument for job specs (spec.Reason*), and
	// timeout for a submission (ReasonOutcomeUnknown).
	Reason string `json:"reason,omitempty"`
	// JobID names the job a submission of unknown outcome
	// (ReasonOutcomeUnknown) would be: look it up before submitting again.
	JobID string `json:"job_id,omitempty"`
	// Reopened lists the steps a job retry reopened before it failed
	// (POST /jobs/{id}/retry): they run again; the others were not
	// reopened.
	Reopened []string `json:"reopened,omitempty"`
}

// isTransport reports whether err, from reading a request body, is the
// body's delivery failing (too large, not arrived in time) rather than
// what it says.
func isTransport(err error) bool {
	var mb *http.MaxBytesError
	return errors.As(err, &mb) || errors.Is(err, os.ErrDeadlineExceeded)
}

// bodyError is the error for a request body that could not be read: a
// body over max_body_bytes is payload_too_large (writeError), one that
// did not arrive within the request's deadline (wrap) is a timeout.
func bodyError(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return &ops.Error{Code: ops.CodeTimeout, Msg: "the request body did not arrive within request_timeout", Err: err}
	}
	return err
}

// writeError writes err in the error shape with its code's status.
func writeError(w http.ResponseWriter, err error) {
	code := ops.CodeOf(err)
	var mb *http.MaxBytesError
	if errors.As(err, &mb) {
		code = ops.CodeTooLarge
	}
	if code == "" {
		code = ops.CodeInternal
	}
	st := code.HTTPStatus()
	if code == ops.CodeUnauthenticated {
		w.Header().Set("WWW-Authenticate", `Bearer realm="warden"`)
	}
	d := ErrorDetail{Code: code, Message: err.Error(), Status: st, Reason: spec.ReasonOf(err)}
	var ou *client.OutcomeUnknownError
	if errors.As(err, &ou) {
		d.Reason, d.JobID = ReasonOutcomeUnknown, ou.JobID
	}
	var pr *ops.PartialRetryError
	if errors.As(err, &pr) {
		d.Reopened = pr.Reopened
	}
	writeJSON(w, st, ErrorBody{Error: d})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
