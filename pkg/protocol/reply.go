package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Reply is the JSON answer to every request on a control subject
// (SubjectControlAdvance, SubjectControlFailover, AgentControlSubject):
//
//	{"ok":true}
//	{"ok":true,"detail":"failover fo-1: 3 tasks moved ..."}
//	{"error":{"code":"not_found","message":"step j.s at epoch 3 is not running here"}}
//
// Build one with OKReply or ErrorReply; read one with ParseReply, which
// returns the error as a *ReplyError to be compared with errors.Is against
// the Err* sentinels below (by code), never by its text.
type Reply struct {
	OK     bool        `json:"ok,omitempty"`
	Detail string      `json:"detail,omitempty"`
	Error  *ReplyError `json:"error,omitempty"`
}

// ReplyCode classifies a failed control request.
type ReplyCode string

// Reply codes.
const (
	// CodeInvalidRequest: the request body is not what the subject expects.
	CodeInvalidRequest ReplyCode = "invalid_request"
	// CodeNotFound: the job, step or agent the request names is not there.
	CodeNotFound ReplyCode = "not_found"
	// CodeFailed: the request was understood but could not be carried out
	// (e.g. the job store was unavailable); asking again later may work.
	CodeFailed ReplyCode = "failed"
)

// ReplyError is a failed control request's error.
type ReplyError struct {
	Code    ReplyCode `json:"code"`
	Message string    `json:"message"`
}

func (e *ReplyError) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return string(e.Code) + ": " + e.Message
}

// Is matches a ReplyError with the same code: errors.Is(err,
// protocol.ErrNotFound) holds for every not_found reply.
func (e *ReplyError) Is(target error) bool {
	var t *ReplyError
	return errors.As(target, &t) && t.Code == e.Code
}

// Sentinels for errors.Is, one per code.
var (
	ErrInvalidRequest error = &ReplyError{Code: CodeInvalidRequest}
	ErrNotFound       error = &ReplyError{Code: CodeNotFound}
	ErrFailed         error = &ReplyError{Code: CodeFailed}
)

// OKReply encodes a success, with an optional detail for people.
func OKReply(detail string) []byte {
	b, _ := json.Marshal(Reply{OK: true, Detail: detail})
	return b
}

// ErrorReply encodes a failure. The code is err's own when err is (or
// wraps) a *ReplyError, else code.
func ErrorReply(code ReplyCode, err error) []byte {
	re := &ReplyError{Code: code, Message: err.Error()}
	var own *ReplyError
	if errors.As(err, &own) {
		re = own
	}
	b, _ := json.Marshal(Reply{Error: re})
	return b
}

// NewReplyError returns a *ReplyError with a formatted message, for a
// responder that wants to choose the code of an error it returns.
func NewReplyError(code ReplyCode, format string, args ...any) error {
	return &ReplyError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ParseReply decodes a control reply: the success's detail, or the
// failure as a *ReplyError. A body that is not a Reply is an error too.
func ParseReply(b []byte) (string, error) {
	var r Reply
	if err := json.Unmarshal(b, &r); err != nil {
		return "", fmt.Errorf("undecodable control reply %q: %w", b, err)
	}
	switch {
	case r.Error != nil:
		return "", r.Error
	case !r.OK:
		return "", fmt.Errorf("control reply %q is neither ok nor an error", b)
	}
	return r.Detail, nil
}
