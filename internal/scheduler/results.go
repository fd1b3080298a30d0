package scheduler

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Reasons a result is rejected (event result_rejected, data.reason): the
// protocol's RejectReason values. A rejected result changes nothing.
const (
	reasonUndecodable     = string(protocol.RejectUndecodable)
	reasonSubjectMismatch = string(protocol.RejectSubjectMismatch)
	reasonBadStatus       = string(protocol.RejectBadStatus)
	reasonUnknownJob      = string(protocol.RejectUnknownJob)
	reasonUnknownStep     = string(protocol.RejectUnknownStep)
	reasonWrongAgent      = string(protocol.RejectWrongAgent)
	reasonWrongToken      = string(protocol.RejectWrongToken)
)

// resultRoute reads the job a stored result subject names:
// warden.result.<p>.<pool>.<agent>.<job>.<step>.
func resultRoute(subject string) (job string, ok bool) {
	tok := strings.Split(subject, ".")
	if len(tok) != 7 {
		return "", false
	}
	return tok[5], true
}

// decodeResult decodes a result and checks it against its subject: the
// subject carries the identity the server authenticated, so the body must
// name the same agent, pool, job and step. An optional field that does not
// decode (a timestamp without its zone, "retry_after": "5") is treated as
// absent and named in ignored; only a body whose identity does not decode
// is refused. Refused for one such field, a result that answered its
// dispatch was lost: the step waited for its whole lease and ran again,
// and the agent's own Nats-Msg-Id kept a corrected copy out for the
// stream's duplicate window.
func decodeResult(msg jetstream.Msg) (r *protocol.Result, ignored []string, reason string, err error) {
	r = new(protocol.Result)
	if jerr := json.Unmarshal(msg.Data(), r); jerr != nil {
		*r = protocol.Result{}
		if ignored, jerr = decodeLenient(msg.Data(), r); jerr != nil {
			// The event still says whose it is: the subject names them.
			if tok := strings.Split(msg.Subject(), "."); len(tok) == 7 {
				r.Pool, r.Agent, r.JobID, r.StepID = cmp.Or(r.Pool, tok[3]), cmp.Or(r.Agent, tok[4]), cmp.Or(r.JobID, tok[5]), cmp.Or(r.StepID, tok[6])
			}
			return r, nil, reasonUndecodable, fmt.Errorf("result body is not a JSON result: %w", jerr)
		}
	}
	tok := strings.Split(msg.Subject(), ".")
	if len(tok) != 7 {
		return r, ignored, reasonSubjectMismatch, fmt.Errorf("subject %s is not warden.result.<pool>.<agent>.<job>.<step>", msg.Subject())
	}
	pool, agent, job, step := tok[3], tok[4], tok[5], tok[6]
	if r.JobID != job || r.StepID != step || r.Agent != agent || (r.Pool != "" && r.Pool != pool) {
		return r, ignored, reasonSubjectMismatch, fmt.Errorf("body names %s/%s step %s.%s but the subject names %s/%s step %s.%s",
			r.Pool, r.Agent, r.JobID, r.StepID, pool, agent, job, step)
	}
	r.Pool = pool
	if r.Status != protocol.ResultSucceeded && r.Status != protocol.ResultFailed {
		return r, ignored, reasonBadStatus, fmt.Errorf("status %q is neither %q nor %q", r.Status, protocol.ResultSucceeded, protocol.ResultFailed)
	}
	return r, ignored, "", nil
}

// decodeLenient decodes a result whose body did not decode as a whole:
// the fields it is fenced and routed by (job, step, epoch, token, agent,
// pool, status: those of the embedded Result) must decode; each optional
// one is decoded on its own and, if it does not, left absent and named in
// ignored ("field: why"). An error text that is not a string is kept as
// its JSON text.
func decodeLenient(data []byte, r *protocol.Result) (ignored []string, err error) {
	var v struct {
		protocol.Result
		// Shadow the Result's optional fields (the outer field wins).
		Truncated  json.RawMessage `json:"truncated"`
		Error      json.RawMessage `json:"error"`
		ErrorClass json.RawMessage `json:"error_class"`
		RetryAfter json.RawMessage `json:"retry_after"`
		StartedAt  json.RawMessage `json:"started_at"`
		FinishedAt json.RawMessage `json:"finished_at"`
	}
	err = json.Unmarshal(data, &v)
	*r = v.Result // what decoded: for the event of a refusal
	if err != nil {
		return nil, err
	}
	field := func(name string, raw json.RawMessage, into any) bool {
		if len(raw) == 0 {
			return true
		}
		if ferr := json.Unmarshal(raw, into); ferr != nil {
			ignored = append(ignored, name+": "+ferr.Error())
			return false
		}
		return true
	}
	field("truncated", v.Truncated, &r.Truncated)
	if !field("error", v.Error, &r.Error) {
		r.Error = string(v.Error)
	}
	field("error_class", v.ErrorClass, &r.ErrorClass)
	if !field("retry_after", v.RetryAfter, &r.RetryAfter) {
		r.RetryAfter = 0
	}
	if !field("started_at", v.StartedAt, &r.StartedAt) {
		r.StartedAt = time.Time{}
	}
	if !field("finished_at", v.FinishedAt, &r.FinishedAt) {
		r.FinishedAt = time.Time{}
	}
	return ignored, nil
}

// ignoredFields records the optional fields of an applied result that did
// not decode (decodeResult): an event naming the step and the agent, so
// that the agent's author learns of it (once: its dedup id is the result
// message's, however often a lost compare-and-set applies it again).
func (w *worker) ignoredFields(jt *jobTurn, k, i int, r *protocol.Result, ignored []string) {
	if len(ignored) == 0 {
		return
	}
	names := make([]string, len(ignored))
	for i, f := range ignored {
		names[i], _, _ = strings.Cut(f, ":")
	}
	w.log.Warn().Str(logging.FieldJob, r.JobID).Str(logging.FieldStep, r.StepID).Uint64(logging.FieldEpoch, r.Epoch).
		Str(logging.FieldAgent, r.Agent).Strs("ignored", ignored).Msg("result applied without the fields that did not decode")
	ev := protocol.Event{Kind: protocol.EventResultFieldsIgnored, ID: r.JobID, JobID: r.JobID, StepID: r.StepID, Agent: r.Agent,
		Reason: "applied without fields that did not decode: " + strings.Join(ignored, "; "),
		Data:   map[string]string{"fields": strings.Join(names, ","), "epoch": strconv.FormatUint(r.Epoch, 10)}}
	jt.events = append(jt.events, outEvent{Event: ev, dedup: msgSeq(jt.inputs[k].msg), write: i})
}

// tooLargeKeepBytes is how large a result of a turn whose write was too
// large may be and still be applied as it is; a larger one loses its
// output, and its error is cut to this.
const tooLargeKeepBytes = 4096

// tooLargeEvery is the count of too-large writes (input.tooLarge) from
// which every result of the turn loses its output, however small: a
// record near the limit can be pushed over it by a small one, and handed
// back, the result came back to do the same until its step's lease ended.
const tooLargeEvery = 2

// applyResult applies an agent's result to its step: fenced by epoch,
// actor and lease token; then the step's direct dependents become ready.
func (w *worker) applyResult(jt *jobTurn, k int, now time.Time) {
	in := jt.inputs[k]
	r, ignored, reason, err := decodeResult(in.msg)
	if reason != "" {
		w.s.rejectResult(jt, k, reason, err, r)
		return
	}
	js := jt.js
	i, ok := js.byID[r.StepID]
	var st *jobstore.Step
	if ok {
		st = js.steps[i]
		if alreadyApplied(st, *r) {
			return // a redelivery after the write: the advance below is all that is left
		}
	}
	if in.tooLarge >= tooLargeEvery || (in.tooLarge > 0 && len(r.Output)+len(r.Error) > tooLargeKeepBytes) {
		// A write of this turn was too large for one message, and this
		// result is big enough to be why: the step fails, for good, saying
		// so (retried, it would make the same output). A small result of
		// the same turn is applied as it is the first time; if the record
		// is still too large, every result of the turn is.
		if r.Status == protocol.ResultSucceeded {
			r.Status, r.ErrorClass = protocol.ResultFailed, protocol.ClassPermanent
			r.Error = fmt.Sprintf("the step's output (%d bytes) makes its record larger than the server takes in one message (max_payload): the output was dropped", len(r.Output))
		} else if len(r.Error) > tooLargeKeepBytes {
			r.Error = r.Error[:tooLargeKeepBytes] + "… (cut: the record was too large)"
		}
		r.Output = nil
	}
	fits := ok && r.Epoch == st.Epoch && st.State == jobstore.StepDispatched && r.Agent == st.Actor && r.Pool == st.Pool && st.TokenMatches(r.Token)
	if !fits && !jt.fresh {
		// The cached records may be older than the store: another
		// scheduler may have owned the job meanwhile (a partition moves
		// when its owner freezes or dies) and dispatched the step again,
		// or added it (a compensation step). Judge a result against what
		// is stored, never against a copy: read the job again and
		// re-apply. Rejected on the copy, an added step's result was lost
		// and the step waited for its lease (make chaos: a saga, 5m30s).
		jt.reload = true
		return
	}
	if !ok {
		w.s.rejectResult(jt, k, reasonUnknownStep, fmt.Errorf("job %s has no step %s", r.JobID, r.StepID), r)
		return
	}
	log := w.log.With().Str(logging.FieldJob, r.JobID).Str(logging.FieldStep, r.StepID).
		Uint64(logging.FieldEpoch, r.Epoch).Str(logging.FieldAgent, r.Agent).Logger()
	if r.Epoch != st.Epoch || st.State != jobstore.StepDispatched {
		jt.count(noWrite, countStaleResult, "")
		log.Warn().Str("state", string(st.State)).Uint64("step_epoch", st.Epoch).Msg("stale result dropped")
		ev := protocol.Event{Kind: protocol.EventStaleResult, ID: r.JobID, JobID: r.JobID,
			StepID: r.StepID, Agent: r.Agent, Reason: fmt.Sprintf("%v: step is %s at epoch %d, result is for epoch %d",
				jobstore.ErrStale, st.State, st.Epoch, r.Epoch),
			Data: map[string]string{"result_epoch": strconv.FormatUint(r.Epoch, 10), "step_epoch": strconv.FormatUint(st.Epoch, 10)}}
		jt.events = append(jt.events, outEvent{Event: ev, dedup: msgSeq(in.msg), write: noWrite})
		return
	}
	if r.Agent != st.Actor || r.Pool != st.Pool {
		// The pool too: an agent id is unique within its pool, and an agent
		// of another pool with the same id could read the holder's task
		// (and its token) where both ids land on one task shard.
		w.s.rejectResult(jt, k, reasonWrongAgent, fmt.Errorf("step %s.%s is held by %s/%s, not %s/%s", r.JobID, r.StepID, st.Pool, st.Actor, r.Pool, r.Agent), r)
		return
	}
	if !st.TokenMatches(r.Token) {
		w.s.rejectResult(jt, k, reasonWrongToken, fmt.Errorf("the result does not carry step %s.%s's lease token for epoch %d", r.JobID, r.StepID, r.Epoch), r)
		return
	}
	class := r.ErrorClass
	reroute := st.FreeReroute(*r)
	if class == protocol.ClassReroute && !reroute {
		// Refused too often in a row, or by an agent outside a cluster: a
		// retriable failure that counts an attempt (jobstore.MaxFreeReroutes).
		class = protocol.ClassRetriable
	}
	decision, delay, again := w.s.retry.Decide(st.Action, st.Retry, max(st.Attempt-1, 0), class, r.Error, r.RetryAfter.Std(), rand.Float64)
	if reroute {
		// A cluster member refused it (cluster.go): route it again shortly.
		delay = rerouteDelay
	}
	before := st.LastError // the attempt before's failure, on a retry
	outcome, err := st.ApplyResult(*r, again, now)
	if err != nil {
		w.s.rejectResult(jt, k, reasonWrongToken, err, r)
		return
	}
	if outcome == jobstore.OutcomeFailed && retryExpiredUnrun(st, r, before) {
		// The retry's task waited past expires_at in the agent's queue and
		// never ran: the step failed with the attempt before's error, as
		// a retry whose backoff ends past the expiry does (below). The
		// agent's "expired: …" stays in the attempt's record.
		st.LastError = before
		st.FailPastExpiry(now)
	}
	if r.Status != protocol.ResultSucceeded {
		if n := len(st.Attempts); n > 0 && st.Attempts[n-1].Epoch == r.Epoch && r.ErrorClass != protocol.ClassReroute {
			// A refusal keeps its class: the refusals in a row are counted
			// by it (jobstore.Step.FreeReroute).
			st.Attempts[n-1].Class = decision.Class
		}
		if outcome == jobstore.OutcomeRetry {
			st.NotBefore = now.Add(delay)
			if !reroute && st.Attempt > 0 && !st.ExpiresAt.IsZero() && st.NotBefore.After(st.ExpiresAt) {
				// Its backoff ends past its expiry: the retry could not
				// start, so the step fails now with this error (dispatch).
				st.FailPastExpiry(now)
				outcome = jobstore.OutcomeFailed
			}
		}
	}
	js.markStep(i)
	w.ignoredFields(jt, k, i, r, ignored)
	status := r.Status
	jt.count(i, Metrics.ResultApplied, status)
	// The agent has a free slot again, whatever its last heartbeat says:
	// once, however often a lost compare-and-set applies the result again.
	if !jt.inputs[k].slotFreed {
		jt.inputs[k].slotFreed = true
		w.s.release(st.Pool, r.Agent, r.FinishedAt)
	}
	jt.freed = append(jt.freed, i) // once the step's write landed: the copy judged may be stale
	switch outcome {
	case jobstore.OutcomeSucceeded:
		log.Debug().Msg("step succeeded")
		js.stepEnded(i, now)
	case jobstore.OutcomeRetry:
		log.Warn().Str("error", r.Error).Str("class", decision.Class).Int("attempt", st.Attempt).Int("max_retries", st.MaxRetries).
			Time("retry_at", st.NotBefore).Msg("step failed; retrying after backoff")
		js.ready = append(js.ready, i)
	case jobstore.OutcomeFailed:
		log.Warn().Str("error", r.Error).Str("class", decision.Class).Bool("retriable", decision.Retriable).Int("attempt", st.Attempt).Msg("step failed")
		js.stepEnded(i, now)
	}
}

// retryExpiredUnrun reports whether r says a retry of st (its attempt
// before failed with before) expired unrun in the agent's queue: its error
// starts "expired" (docs/protocol.md), it ran for no time (an agent reports
// a task it did not run as started and finished when received), after the
// step's expiry, and an earlier attempt left an error. A handler's own
// failure that happens to start "expired:" (a session token) ran, or ran
// before the expiry. An agent that reported the earlier failure itself
// says so already ("<error> (not retried: …)").
func retryExpiredUnrun(st *jobstore.Step, r *protocol.Result, before string) bool {
	return st.Attempt > 1 && before != "" && !st.ExpiresAt.IsZero() && r.Status == protocol.ResultFailed &&
		strings.HasPrefix(r.Error, jobstore.ReasonExpired+":") &&
		r.StartedAt.Equal(r.FinishedAt) && r.StartedAt.After(st.ExpiresAt)
}

// rejectResult records a refused result as an event saying why and
// terminates the message; it changes no state and blocks nothing (the
// genuine result has its own dedup id).
func (s *Scheduler) rejectResult(jt *jobTurn, k int, reason string, err error, r *protocol.Result) {
	in := jt.inputs[k]
	jt.count(noWrite, Metrics.ResultRejected, reason)
	id := jt.id
	if !protocol.ValidToken(id) {
		id = "unknown"
	}
	ev := protocol.Event{Kind: protocol.EventResultRejected, ID: id, JobID: id, Reason: err.Error(),
		Data: map[string]string{"reason": reason, "subject": in.msg.Subject()}}
	if r != nil {
		ev.StepID, ev.Agent = r.StepID, r.Agent
		if r.Epoch > 0 { // 0 is no dispatch's: it did not decode, or was never set
			ev.Data["epoch"] = strconv.FormatUint(r.Epoch, 10)
		}
	}
	s.log.Warn().Str(logging.FieldJob, id).Str("reason", reason).Err(err).Str("subject", in.msg.Subject()).Msg("result rejected")
	jt.events = append(jt.events, outEvent{Event: ev, dedup: msgSeq(in.msg), write: noWrite})
	jt.settle[k].term = "result rejected: " + reason
}

func msgSeq(m jetstream.Msg) string {
	if md, err := m.Metadata(); err == nil {
		return strconv.FormatUint(md.Sequence.Stream, 10)
	}
	return "0"
}

// alreadyApplied reports whether this exact result was written to the step
// before (the message was redelivered after the write).
func alreadyApplied(st *jobstore.Step, r protocol.Result) bool {
	for _, a := range st.Attempts {
		if a.Epoch == r.Epoch && a.Status == r.Status && a.FinishedAt.Equal(r.FinishedAt) &&
			!(st.State == jobstore.StepDispatched && st.Epoch == r.Epoch) {
			return true
		}
	}
	return false
}
