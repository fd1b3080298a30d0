package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/protocol"
)

// resultHeadroom is what a result message's headers and subject may take
// of the server's max_payload beside the body.
const resultHeadroom = 4096

// minResultBytes is the least a result's body is cut to (max_result_bytes'
// own minimum), where the server's max_payload leaves less than that beside
// resultHeadroom; then only the message's real headers are left out of it.
const minResultBytes = 1024

// maxPublishWait bounds reporting a step that has no deadline.
const maxPublishWait = 30 * time.Second

// publishAttempt bounds one publish of a result. A PubAck lost as the
// server restarts never comes: without a bound the attempt would wait for
// the step's deadline while the lease keeper holds the task. Attempts
// repeat the same Nats-Msg-Id, so a retry after a slow PubAck is stored once.
const publishAttempt = 2 * time.Second

// report publishes the result and, only once the server stored it (PubAck),
// acks the task: a task is never lost between the two. Nothing is published
// at or after the step's deadline. The stored result is remembered for t
// before the ack (recentReports).
func (a *Agent) report(workCtx context.Context, msg jetstream.Msg, t protocol.Task, p plan, res protocol.Result, log zerolog.Logger) {
	// Cut from the handler's own result every time, so that the output's
	// original_bytes is its size, not that of an earlier cut.
	orig := res
	m, res, fittedTo, err := a.resultMsg(orig, log)
	if err != nil {
		log.Error().Err(err).Str("status", orig.Status).Msg("result not reported: leaving the task to redelivery")
		return
	}
	// A finished result is worth reporting even while shutting down.
	ctx := context.WithoutCancel(workCtx)
	var cancel context.CancelFunc
	if p.reportBy.IsZero() {
		ctx, cancel = context.WithTimeout(ctx, maxPublishWait)
	} else {
		ctx, cancel = context.WithDeadline(ctx, p.reportBy)
	}
	defer cancel()

	backoff := 50 * time.Millisecond
	for {
		if p.late(a.now()) {
			a.stats.expired.Add(1)
			log.Warn().Time("deadline", p.reportBy).Str("status", res.Status).
				Msg("deadline passed before the result was stored: not reporting; the supervisor re-dispatches")
			a.deadLetter(msg, protocol.DLQExpired, "deadline passed before the "+res.Status+" result was stored")
			return
		}
		if ctx.Err() != nil {
			log.Error().Str("status", res.Status).Msg("result not stored in time: leaving the task to redelivery")
			return
		}
		pctx, pcancel := context.WithTimeout(ctx, publishAttempt)
		_, err = a.js.PublishMsg(pctx, m)
		pcancel()
		if err == nil {
			break
		}
		if errors.Is(err, nats.ErrConnectionClosed) {
			// Closed for good: every retry until the deadline would fail
			// the same way, and kept Run's drain waiting for this task.
			// The supervisor moves the step to another agent.
			log.Warn().Err(err).Str("status", res.Status).Msg("connection closed for good: result not reported")
			return
		}
		if mp := int(a.nc.MaxPayload()); errors.Is(err, nats.ErrMaxPayload) && mp != fittedTo {
			// The server's limit changed under us (a reconnect to a
			// server that takes less): cut the result again to the new
			// limit rather than retry what is refused every time.
			if m, res, fittedTo, err = a.resultMsg(orig, log); err != nil {
				log.Error().Err(err).Str("status", orig.Status).Msg("result not reported: leaving the task to redelivery")
				return
			}
			continue
		}
		log.Warn().Err(err).Msg("publish result failed; retrying")
		sleepCtx(ctx, backoff) // a cut-short sleep ends the loop at the checks above
		backoff = min(2*backoff, time.Second)
	}
	switch {
	case res.Status == protocol.ResultSucceeded:
		a.stats.succeeded.Add(1)
	case res.ErrorClass == protocol.ClassReroute:
		// A cluster task refused unrun (not this member's epoch) is no
		// failure of this agent: it is counted in ClusterFenced. Counted as
		// failed, the supervisor's health assessment reads a former leader
		// that comes back and refuses what was queued to it as failing
		// every task — a standby never runs one to make up for it — and
		// its healing drains it, taking it out of its cluster.
	default:
		a.stats.failed.Add(1)
	}
	logResult(log, res)
	a.reported.add(t, res, m, p.reportBy, a.now())
	if a.hooks != nil && a.hooks.Reported != nil {
		a.hooks.Reported(res.JobID, res.StepID)
	}
	a.ackReported(msg, log)
}

// reportAgain settles a delivery of a task whose result this agent has
// stored already (recentReports): it publishes that result again, if it
// is kept (stored is nil if not) and the task's deadline has not passed
// (nothing is published at or after it), then acks the task. The copy has
// the original's body and Nats-Msg-Id: the results stream drops it as a
// duplicate within its window, and the scheduler takes it for the result
// it applied (alreadyApplied) after that; a result that was lost is
// restored. The ack does not depend on the copy: the original is stored.
func (a *Agent) reportAgain(workCtx context.Context, msg jetstream.Msg, stored *nats.Msg, deadline time.Time, log zerolog.Logger) {
	a.stats.reportedAgain.Add(1)
	if stored != nil && (deadline.IsZero() || a.now().Before(deadline)) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(workCtx), publishAttempt)
		if !deadline.IsZero() {
			var cancelBy context.CancelFunc
			ctx, cancelBy = context.WithDeadline(ctx, deadline)
			defer cancelBy()
		}
		_, err := a.js.PublishMsg(ctx, stored)
		cancel()
		if err != nil {
			log.Warn().Err(err).Msg("publishing the stored result again failed; acking the task anyway: the result is stored")
		}
	}
	a.ackReported(msg, log)
}

// ackReported acks a task whose result is stored. If the ack is lost, the
// redelivery is acked unrun (recentReports), or, once forgotten, run again
// and its result deduplicated or fenced by epoch. So nothing waits for the
// server to confirm it: the ack is a plain publish, buffered with the
// client's other writes and flushed by the connection (Close and Drain
// flush too). Until session 9 it was a DoubleAck, a request whose reply
// was one more message from the server per task and held the slot until
// it came; a plain ack made jobs_per_s 12 % higher in an A/B
// (docs/performance.md, "Session 9").
func (a *Agent) ackReported(msg jetstream.Msg, log zerolog.Logger) {
	if err := msg.Ack(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		log.Warn().Err(err).Msg("ack after result failed")
	}
}

// resultMsg is the message reporting r, r cut to fit it if need be (see
// resultLimit), the result it carries, and the server's max_payload it was
// fitted to (0: unknown). An error means that not even r cut to nothing but
// its fields fits the server's max_payload: nothing can report the step.
func (a *Agent) resultMsg(r protocol.Result, log zerolog.Logger) (*nats.Msg, protocol.Result, int, error) {
	m := resultEnvelope(r)
	outBytes := len(r.Output)
	mp := int(a.nc.MaxPayload())
	limit := a.resultLimit(mp, payloadBytes(m))
	b, cut, err := fitResult(&r, limit)
	if err != nil {
		return nil, r, mp, err
	}
	m.Data = b
	if cut {
		log.Warn().Int("max_result_bytes", limit).Int("original_output_bytes", outBytes).
			Msg("result too large: output truncated")
	}
	if n := payloadBytes(m); mp > 0 && n > mp {
		return nil, r, mp, fmt.Errorf("result of %d bytes (headers included), cut to the least it can be, does not fit the server's max_payload of %d bytes",
			n, mp)
	}
	return m, r, mp, nil
}

// resultLimit is the most a result's body may take: max_result_bytes, or
// less where the server's max_payload (mp; 0: unknown) is smaller, less
// resultHeadroom for the headers, but no less than minResultBytes while
// the message's real headers (hdr bytes) leave room for that.
func (a *Agent) resultLimit(mp, hdr int) int {
	limit := a.cfg.MaxResultBytes
	if mp <= 0 {
		return limit
	}
	// A result over the server's max_payload is refused before it is sent,
	// every time: it was retried until the step's deadline, then run
	// again. Where the 4 KiB headroom leaves less than minResultBytes
	// (below ~5 KiB of max_payload), a fixed floor was no bound: it kept
	// an 8 KiB error, and headers beside a 1 KiB body could overflow it.
	return min(limit, max(mp-resultHeadroom, min(mp-hdr, minResultBytes)))
}

// payloadBytes is what the server counts of m against its max_payload: the
// body and the encoded headers.
func payloadBytes(m *nats.Msg) int {
	return m.Size() - len(m.Subject) - len(m.Reply)
}

// ResultMsg is the message an agent publishes to report r: subject
// protocol.ResultSubject(r.Pool, r.Agent, r.JobID, r.StepID), the job, step,
// epoch and agent headers, and the Nats-Msg-Id that deduplicates it
// (protocol.ResultMsgID). Tests use it to publish a result by hand.
func ResultMsg(r protocol.Result) (*nats.Msg, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	m := resultEnvelope(r)
	m.Data = b
	return m, nil
}

// resultEnvelope is ResultMsg without its body: the subject and headers.
func resultEnvelope(r protocol.Result) *nats.Msg {
	m := nats.NewMsg(protocol.ResultSubject(r.Pool, r.Agent, r.JobID, r.StepID))
	m.Header.Set(protocol.HeaderJob, r.JobID)
	m.Header.Set(protocol.HeaderStep, r.StepID)
	m.Header.Set(protocol.HeaderEpoch, strconv.FormatUint(r.Epoch, 10))
	m.Header.Set(protocol.HeaderAgent, r.Agent)
	m.Header.Set(protocol.HeaderMsgID, protocol.ResultMsgID(r.JobID, r.StepID, r.Epoch, r.Token))
	return m
}

// maxErrorBytes bounds a result's error message.
const maxErrorBytes = 8 << 10

// truncatedSuffix ends an error message that was cut.
const truncatedSuffix = "… (truncated)"

// fitResult cuts r to encode in at most limit bytes, if it can, and
// returns its encoding and whether anything was cut.
func fitResult(r *protocol.Result, limit int) ([]byte, bool, error) {
	cut := boundResult(r, limit)
	b, err := json.Marshal(*r)
	if err != nil {
		return nil, cut, fmt.Errorf("encode result: %w", err)
	}
	if !cut && len(b) > limit {
		// Over the limit uncut (boundResult's estimate misses an
		// escaping-heavy error): cut it, measuring this time. Not a cut
		// result again: its original_bytes would be the first cut's.
		cut = cutResult(r, limit)
		if b, err = json.Marshal(*r); err != nil {
			return nil, cut, fmt.Errorf("encode result: %w", err)
		}
	}
	return b, cut, nil
}

// boundResult cuts a result whose encoding would exceed limit bytes: the
// error to maxErrorBytes, the output to a JSON object holding its start
// and its original size. It reports whether anything was cut. A result
// well within the limit is not encoded to be measured (the common case):
// the caller measures the encoding it makes anyway (resultMsg).
func boundResult(r *protocol.Result, limit int) bool {
	// Room for everything but the output, with a margin for escaping.
	room := max(limit-2048-2*len(r.Error), 0)
	if len(r.Error) <= maxErrorBytes && len(r.Output) <= room {
		return false
	}
	return cutResult(r, limit)
}

// cutResult cuts r until its encoding takes at most limit bytes, measuring
// it: the error to maxErrorBytes at most, the output, if it does not fit,
// to {"truncated": true, "original_bytes": n, "head": "…"}, then halves the
// larger of the two until it fits. If even both cut to nothing do not fit,
// r is left so (the caller sees it does not fit). It reports whether
// anything was cut; r.Truncated says so too.
func cutResult(r *protocol.Result, limit int) bool {
	out, text := r.Output, r.Error
	errN := min(len(text), maxErrorBytes)
	headN := len(out)
	if room := max(limit-2048-2*errN, 0); len(out) > room {
		headN = room / 2 // the escaping of a JSON string at most doubles it
	}
	for {
		c := *r
		if errN < len(text) {
			c.Error = cutUTF8(text, errN) + truncatedSuffix
		}
		if headN < len(out) {
			head := cutUTF8(string(out[:headN+1]), headN) // not a copy of all of out
			c.Output, _ = json.Marshal(map[string]any{"truncated": true, "original_bytes": len(out), "head": head})
		}
		cut := errN < len(text) || headN < len(out)
		c.Truncated = r.Truncated || cut
		b, err := json.Marshal(c)
		if (err == nil && len(b) <= limit) || (headN == 0 && errN == 0) {
			*r = c
			return cut
		}
		if headN >= errN {
			headN /= 2
		} else {
			errN /= 2
		}
	}
}

// cutUTF8 is s cut to at most n bytes, at the start of a rune: a rune cut
// in two is encoded as three bytes of U+FFFD, and grows the cut.
func cutUTF8(s string, n int) string {
	if n >= len(s) {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
