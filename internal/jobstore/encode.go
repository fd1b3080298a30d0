package jobstore

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// The scheduler re-encodes a job's record on every change, and under load
// encoding/json's reflection, and the validation it runs on every value
// with its own MarshalJSON (each time.Time, Duration and RawMessage), were
// a fifth of the scheduler's CPU (docs/performance.md, "Session 8"). These
// functions write the same bytes as json.Marshal for Job, Step and Attempt
// (TestRecordEncodingMatchesEncodingJSON fills every field, so a field
// added to a record but not here fails it); reading stays with
// encoding/json.
//
// Params and Output are copied as they are: they were produced by
// json.Marshal or checked by json.Unmarshal before they reached a record,
// so they are valid JSON (json.Marshal would also compact them and escape
// HTML characters in them; the meaning is the same).

// appendJob appends j encoded as JSON.
func appendJob(b []byte, j *Job) []byte {
	b = append(b, `{"id":`...)
	b = appendString(b, j.ID)
	b = append(b, `,"name":`...)
	b = appendString(b, j.Name)
	b = append(b, `,"spec":`...)
	b = appendValue(b, j.Spec)
	b = append(b, `,"desired":`...)
	b = appendString(b, string(j.Desired))
	b = append(b, `,"state":`...)
	b = appendString(b, string(j.State))
	if j.Error != "" {
		b = append(b, `,"error":`...)
		b = appendString(b, j.Error)
	}
	b = append(b, `,"created_at":`...)
	b = appendTime(b, j.CreatedAt)
	b = append(b, `,"updated_at":`...)
	b = appendTime(b, j.UpdatedAt)
	if !j.FinishedAt.IsZero() {
		b = append(b, `,"finished_at":`...)
		b = appendTime(b, j.FinishedAt)
	}
	if j.Inline {
		b = append(b, `,"inline":true`...)
	}
	if j.ForwardSteps != 0 {
		b = append(b, `,"forward_steps":`...)
		b = strconv.AppendInt(b, int64(j.ForwardSteps), 10)
	}
	if j.CompensateOnCancel {
		b = append(b, `,"compensate_on_cancel":true`...)
	}
	if !j.Deadline.IsZero() {
		b = append(b, `,"deadline":`...)
		b = appendTime(b, j.Deadline)
	}
	if j.TimedOut {
		b = append(b, `,"timed_out":true`...)
	}
	if len(j.Steps) > 0 {
		b = append(b, `,"steps":[`...)
		for i, st := range j.Steps {
			if i > 0 {
				b = append(b, ',')
			}
			if st == nil {
				b = append(b, "null"...)
				continue
			}
			b = appendStep(b, st)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendStep appends st encoded as JSON.
func appendStep(b []byte, st *Step) []byte {
	b = append(b, `{"job_id":`...)
	b = appendString(b, st.JobID)
	b = append(b, `,"id":`...)
	b = appendString(b, st.ID)
	b = append(b, `,"action":`...)
	b = appendString(b, st.Action)
	if len(st.Params) > 0 {
		b = append(b, `,"params":`...)
		b = append(b, st.Params...)
	}
	b = append(b, `,"pool":`...)
	b = appendString(b, st.Pool)
	b = appendOptString(b, `,"agent":`, st.Agent)
	b = appendOptString(b, `,"cluster":`, st.Cluster)
	b = appendOptString(b, `,"target":`, st.Target)
	if st.ClusterEpoch != 0 {
		b = append(b, `,"cluster_epoch":`...)
		b = strconv.AppendUint(b, st.ClusterEpoch, 10)
	}
	b = appendOptStrings(b, `,"requires":`, st.Requires)
	b = appendOptStrings(b, `,"depends_on":`, st.DependsOn)
	b = append(b, `,"timeout":`...)
	b = appendDuration(b, st.Timeout)
	b = append(b, `,"max_retries":`...)
	b = strconv.AppendInt(b, int64(st.MaxRetries), 10)
	if st.Retry != nil {
		b = append(b, `,"retry":`...)
		b = appendValue(b, st.Retry)
	}
	b = appendOptTime(b, `,"not_before":`, st.NotBefore)
	b = appendOptTime(b, `,"expires_at":`, st.ExpiresAt)
	b = append(b, `,"desired":`...)
	b = appendString(b, string(st.Desired))
	b = append(b, `,"state":`...)
	b = appendString(b, string(st.State))
	b = append(b, `,"epoch":`...)
	b = strconv.AppendUint(b, st.Epoch, 10)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(st.Attempt), 10)
	b = appendOptString(b, `,"actor":`, st.Actor)
	b = appendOptString(b, `,"token":`, st.Token)
	b = appendOptTime(b, `,"locked_until":`, st.LockedUntil)
	b = appendOptString(b, `,"transferred_from":`, st.TransferredFrom)
	if st.Recoveries != 0 {
		b = append(b, `,"recoveries":`...)
		b = strconv.AppendInt(b, int64(st.Recoveries), 10)
	}
	b = appendOptString(b, `,"waiting":`, st.Waiting)
	b = append(b, `,"error_count":`...)
	b = strconv.AppendInt(b, int64(st.ErrorCount), 10)
	b = appendOptString(b, `,"last_error":`, st.LastError)
	if len(st.Output) > 0 {
		b = append(b, `,"output":`...)
		b = append(b, st.Output...)
	}
	if len(st.Attempts) > 0 {
		b = append(b, `,"attempts":[`...)
		for i := range st.Attempts {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendAttempt(b, &st.Attempts[i])
		}
		b = append(b, ']')
	}
	b = append(b, `,"created_at":`...)
	b = appendTime(b, st.CreatedAt)
	b = append(b, `,"updated_at":`...)
	b = appendTime(b, st.UpdatedAt)
	b = appendOptTime(b, `,"finished_at":`, st.FinishedAt)
	return append(b, '}')
}

// appendAttempt appends a encoded as JSON.
func appendAttempt(b []byte, a *Attempt) []byte {
	b = append(b, `{"epoch":`...)
	b = strconv.AppendUint(b, a.Epoch, 10)
	b = append(b, `,"agent":`...)
	b = appendString(b, a.Agent)
	b = appendOptTime(b, `,"started_at":`, a.StartedAt)
	b = appendOptTime(b, `,"finished_at":`, a.FinishedAt)
	b = append(b, `,"status":`...)
	b = appendString(b, a.Status)
	b = appendOptString(b, `,"error":`, a.Error)
	b = appendOptString(b, `,"class":`, a.Class)
	return append(b, '}')
}

func appendOptString(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return appendString(append(b, key...), s)
}

func appendOptStrings(b []byte, key string, ss []string) []byte {
	if len(ss) == 0 {
		return b
	}
	b = append(append(b, key...), '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}

func appendOptTime(b []byte, key string, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	return appendTime(append(b, key...), t)
}

// appendString appends s as a JSON string. Identifiers, states and
// timestamps are plain ASCII and copied; anything else (escapes, HTML
// characters, non-ASCII) goes through encoding/json for its exact rules.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return appendValue(b, s)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendTime appends t as time.Time.MarshalJSON does, falling back to it
// for the years RFC 3339 cannot write (where it fails, as json.Marshal
// does).
func appendTime(b []byte, t time.Time) []byte {
	if y := t.Year(); y < 0 || y > 9999 {
		return appendValue(b, t)
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

func appendDuration(b []byte, d protocol.Duration) []byte {
	return appendString(b, d.String())
}

// appendValue appends v encoded by encoding/json: the parts of a record
// that are rare (retry overrides) or free-form (the spec with its params).
// A value that cannot be encoded is written as null; the records' types
// always encode.
func appendValue(b []byte, v any) []byte {
	enc, err := json.Marshal(v)
	if err != nil {
		return append(b, "null"...)
	}
	return append(b, enc...)
}
