package agent

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/pkg/protocol"
)

// resultHeadroom is what a result message's headers and subject may take
// of the server's max_payload beside the body.
const resultHeadroom = 4096

// maxPublishWait bounds reporting a step that has no deadline.
const maxPublishWait = 30 * time.Second

// publishAttempt bounds one publish of a result. A PubAck lost as the
// server restarts never comes: without a bound the attempt would wait for
// the step's deadline while the lease keeper holds the task. Attempts
// repeat the same Nats-Msg-Id, so a retry after a slow PubAck is stored once.
const publishAttempt = 2 * time.Second

// report publishes the result and, only once the server stored it (PubAck),
// acks the task: a task is never lost between the two. Nothing is published
// at or after the step's deadline. runKey is the dispatch's key, remembered
// as reported before the ack (recentReports).
func (a *Agent) report(workCtx context.Context, msg jetstream.Msg, runKey string, p plan, res protocol.Result, log zerolog.Logger) {
	limit := a.cfg.MaxResultBytes
	if mp := int(a.nc.MaxPayload()); mp > 0 && mp-resultHeadroom < limit {
		// The server takes less than max_result_bytes in one message: a
		// result over its max_payload is refused before it is sent, every
		// time, and was retried until the step's deadline, then run again.
		limit = max(mp-resultHeadroom, 1024)
	}
	if boundResult(&res, limit) {
		log.Warn().Int("max_result_bytes", limit).Msg("result too large: output truncated")
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

	m, err := ResultMsg(res)
	if err != nil {
		log.Error().Err(err).Msg("encode result")
		return
	}
	backoff := 50 * time.Millisecond
	floored := false
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
		if errors.Is(err, nats.ErrMaxPayload) && !floored {
			floored = true
			// Still too large (the server's limit changed under us): cut
			// it to the least a result may be, once, rather than retry
			// what is refused every time.
			boundResult(&res, 1024)
			if m, err = ResultMsg(res); err != nil {
				log.Error().Err(err).Msg("encode result")
				return
			}
			log.Warn().Msg("result over the server's max_payload: output truncated")
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
	a.reported.add(runKey)
	if a.hooks != nil && a.hooks.Reported != nil {
		a.hooks.Reported(res.JobID, res.StepID)
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

// ResultMsg is the message an agent publishes to report r: subject
// protocol.ResultSubject(r.Pool, r.Agent, r.JobID, r.StepID), the job, step,
// epoch and agent headers, and the Nats-Msg-Id that deduplicates it
// (protocol.ResultMsgID). Tests use it to publish a result by hand.
func ResultMsg(r protocol.Result) (*nats.Msg, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(protocol.ResultSubject(r.Pool, r.Agent, r.JobID, r.StepID))
	m.Data = b
	m.Header.Set(protocol.HeaderJob, r.JobID)
	m.Header.Set(protocol.HeaderStep, r.StepID)
	m.Header.Set(protocol.HeaderEpoch, strconv.FormatUint(r.Epoch, 10))
	m.Header.Set(protocol.HeaderAgent, r.Agent)
	m.Header.Set(protocol.HeaderMsgID, protocol.ResultMsgID(r.JobID, r.StepID, r.Epoch, r.Token))
	return m, nil
}

// maxErrorBytes bounds a result's error message.
const maxErrorBytes = 8 << 10

// boundResult cuts a result whose encoding would exceed max bytes: the
// error to maxErrorBytes, the output to a JSON object holding its start.
// It reports whether anything was cut.
func boundResult(r *protocol.Result, limit int) bool {
	cut := false
	if len(r.Error) > maxErrorBytes {
		r.Error = r.Error[:maxErrorBytes] + "… (truncated)"
		cut = true
	}
	// Room for everything but the output, with a margin for escaping.
	room := max(limit-2048-2*len(r.Error), 0)
	if len(r.Output) > room {
		head := string(r.Output[:room/2])
		b, _ := json.Marshal(map[string]any{"truncated": true, "original_bytes": len(r.Output), "head": head})
		r.Output = b
		cut = true
	}
	if cut {
		r.Truncated = true
	}
	return cut
}
