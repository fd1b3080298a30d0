package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/ops"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
)

// Prefix is the versioned API root.
const Prefix = "/api/v1"

// routes is the API: every operation, its scope and its handler.
func (s *Server) routes() []route {
	r, a := ScopeRead, ScopeAdmin
	return []route{
		{Method: "GET", Path: Prefix + "/openapi.yaml", Scope: ScopeNone, h: s.openAPI},
		{Method: "GET", Path: Prefix + "/overview", Scope: r, h: s.overview},

		{Method: "POST", Path: Prefix + "/jobs", Scope: a, h: s.submitJob},
		{Method: "GET", Path: Prefix + "/jobs", Scope: r, h: s.listJobs},
		{Method: "GET", Path: Prefix + "/jobs/{id}", Scope: r, h: s.showJob},
		{Method: "POST", Path: Prefix + "/jobs/{id}/cancel", Scope: a, h: s.cancelJob},
		{Method: "POST", Path: Prefix + "/jobs/{id}/retry", Scope: a, h: s.retryJob},

		{Method: "GET", Path: Prefix + "/agents", Scope: r, h: s.listAgents},
		{Method: "GET", Path: Prefix + "/agents/{pool}/{id}", Scope: r, h: s.showAgent},
		{Method: "GET", Path: Prefix + "/agents/{pool}/{id}/health", Scope: r, h: s.agentHealth},
		{Method: "POST", Path: Prefix + "/agents/{pool}/{id}/drain", Scope: a, h: s.agentAction((*ops.Ops).DrainAgent, "drained")},
		{Method: "POST", Path: Prefix + "/agents/{pool}/{id}/undrain", Scope: a, h: s.agentAction((*ops.Ops).UndrainAgent, "undrained")},
		{Method: "POST", Path: Prefix + "/agents/{pool}/{id}/failover", Scope: a, h: s.failoverAgent},

		{Method: "GET", Path: Prefix + "/queues/tasks", Scope: r, h: s.taskQueues},
		{Method: "GET", Path: Prefix + "/queues/dead-letters", Scope: r, h: s.listDeadLetters},
		{Method: "DELETE", Path: Prefix + "/queues/dead-letters", Scope: a, h: s.purgeDeadLetters},
		{Method: "GET", Path: Prefix + "/queues/dead-letters/{id}", Scope: r, h: s.showDeadLetter},
		{Method: "POST", Path: Prefix + "/queues/dead-letters/{id}/retry", Scope: a, h: s.retryDeadLetter},

		{Method: "GET", Path: Prefix + "/healing/actions", Scope: r, h: s.eventList(protocol.EventHealing)},
		{Method: "GET", Path: Prefix + "/healing/status", Scope: r, h: s.healingStatus},
		{Method: "GET", Path: Prefix + "/failovers", Scope: r, h: s.eventList(protocol.EventFailover)},

		{Method: "GET", Path: Prefix + "/clusters", Scope: r, h: s.listClusters},
		{Method: "POST", Path: Prefix + "/clusters", Scope: a, h: s.putCluster(true)},
		{Method: "GET", Path: Prefix + "/clusters/{name}", Scope: r, h: s.showCluster},
		{Method: "PUT", Path: Prefix + "/clusters/{name}", Scope: a, h: s.putCluster(false)},
		{Method: "DELETE", Path: Prefix + "/clusters/{name}", Scope: a, h: s.deleteCluster},
		{Method: "POST", Path: Prefix + "/clusters/{name}/rebalance", Scope: a, h: s.clusterRequest(protocol.RequestRebalance)},
		{Method: "POST", Path: Prefix + "/clusters/{name}/failover", Scope: a, h: s.clusterRequest(protocol.RequestFailover)},

		{Method: "GET", Path: Prefix + "/events", Scope: r, Stream: true, h: s.events},
	}
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request) error {
	ov, err := s.ops.Overview(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ov)
	return nil
}

// submitJob takes a job spec, YAML or JSON, as the body.
//
// Shutdown ends the wait for the scheduler's confirmation: the job is
// stored once the PubAck came, so it is answered 201, unconfirmed, within
// the shutdown's grace, not cut off. Submit has one context for the
// publish and that wait, so shutdown ends the wait for the PubAck too; the
// publish itself is out of the API's hands by then (on the wire, or in the
// connection's reconnect buffer while NATS restarts) and may be stored
// after. The job is looked for (submitted) until the grace or the
// request's deadline ends: found, 201 unconfirmed. A submission whose
// outcome stays unknown is answered 504 timeout, reason outcome_unknown,
// with its job_id: not a 500 that a client retries into a second job.
func (s *Server) submitJob(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return bodyError(err)
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return ops.Errorf(ops.CodeInvalid, "empty body: send a job spec (YAML or JSON)")
	}
	sctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	if s.closing != nil {
		defer context.AfterFunc(s.closing, cancel)()
	}
	rc, err := s.ops.SubmitJob(sctx, body)
	cut := err != nil && r.Context().Err() == nil && sctx.Err() != nil
	unknown := errors.Is(err, client.ErrOutcomeUnknown)
	if cut && (rc.Sequence > 0 || (unknown && s.submitted(r.Context(), rc.JobID))) {
		err, rc.Confirmed = nil, false
	} else if unknown {
		s.log.Warn().Err(err).Str("job_id", rc.JobID).Msg("submission of unknown outcome: the job may have been stored")
		return &ops.Error{Code: ops.CodeTimeout, Err: err,
			Msg: fmt.Sprintf("job %s may have been stored: look it up (GET %s/jobs/%s) before submitting the spec again", rc.JobID, Prefix, rc.JobID)}
	}
	if err != nil {
		return err
	}
	st := http.StatusCreated
	if rc.Existing {
		st = http.StatusOK
	}
	w.Header().Set("Location", Prefix+"/jobs/"+rc.JobID)
	writeJSON(w, st, rc)
	return nil
}

// submittedPoll is how often submitted looks for a job.
const submittedPoll = 100 * time.Millisecond

// submitted looks for job, whose publish was sent but not answered, until
// it finds it (queued, held until its start, or made into a record: what
// GET /jobs/{id} finds) or ctx ends, and at most until the shutdown's
// grace leaves just the time to answer. Not finding it proves nothing:
// the publish may still be in the connection's buffer.
func (s *Server) submitted(ctx context.Context, job string) bool {
	ctx, cancel := context.WithTimeout(ctx, shutdownGrace-answerMargin)
	defer cancel()
	for {
		lctx, lcancel := context.WithTimeout(ctx, time.Second)
		_, err := s.ops.Job(lctx, job)
		lcancel()
		if err == nil {
			return true
		}
		t := time.NewTimer(submittedPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// listJobs: ?state=a,b&since=1h&created_after=RFC3339&created_before=RFC3339&limit=N&cursor=C
// (since or created_after, not both).
func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if q.Get("since") != "" && q.Get("created_after") != "" {
		return ops.Errorf(ops.CodeInvalid, "since and created_after both bound the jobs' creation from below: give one")
	}
	f := jobstore.ListFilter{Cursor: q.Get("cursor")}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if st = strings.TrimSpace(st); st != "" {
				f.States = append(f.States, jobstore.JobState(st))
			}
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return ops.Errorf(ops.CodeInvalid, "limit %q: want a number from 1 to %d", v, jobstore.MaxListLimit)
		}
		f.Limit = n
	}
	if v := q.Get("since"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return ops.Errorf(ops.CodeInvalid, "since %q: want a positive duration such as 1h", v)
		}
		f.CreatedAfter = s.now().Add(-d)
	}
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"created_after", &f.CreatedAfter}, {"created_before", &f.CreatedBefore}} {
		t, err := timeParam(q, p.name)
		if err != nil {
			return err
		}
		if !t.IsZero() {
			*p.dst = t
		}
	}
	p, err := s.ops.ListJobs(r.Context(), f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, p)
	return nil
}

func (s *Server) showJob(w http.ResponseWriter, r *http.Request) error {
	d, err := s.ops.Job(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

func (s *Server) cancelJob(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	rep, err := s.ops.CancelJob(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, rep)
	return nil
}

// retryJob reopens a finished job's failed, dead-lettered, cancelled and expired
// steps. A retry that fails part-way (ops.PartialRetryError) lists the
// steps it reopened (ErrorDetail.Reopened).
func (s *Server) retryJob(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	steps, err := s.ops.RetryJob(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"job_id": id, "reopened": steps})
	return nil
}

func (s *Server) listAgents(w http.ResponseWriter, r *http.Request) error {
	as, err := s.ops.Agents(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, as)
	return nil
}

func (s *Server) showAgent(w http.ResponseWriter, r *http.Request) error {
	a, err := s.ops.Agent(r.Context(), r.PathValue("pool"), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, a)
	return nil
}

func (s *Server) agentHealth(w http.ResponseWriter, r *http.Request) error {
	a, err := s.ops.Agent(r.Context(), r.PathValue("pool"), r.PathValue("id"))
	if err != nil {
		return err
	}
	if a.Health == nil {
		return ops.Errorf(ops.CodeNotFound, "agent %s.%s has not been assessed yet (no supervisor leader, or it just joined)", a.Pool, a.ID)
	}
	writeJSON(w, http.StatusOK, a.Health)
	return nil
}

// agentAction drains or undrains a present agent.
func (s *Server) agentAction(f func(*ops.Ops, context.Context, string, string) error, done string) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		// An absent agent is not found (ops.agentRequest).
		pool, id := r.PathValue("pool"), r.PathValue("id")
		if err := f(s.ops, r.Context(), pool, id); err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, map[string]string{"pool": pool, "agent": id, "result": done})
		return nil
	}
}

// failoverAgent drains the agent if it is present, then asks the supervisor
// leader to move its queued tasks. A departed agent can be failed over too.
func (s *Server) failoverAgent(w http.ResponseWriter, r *http.Request) error {
	pool, id := r.PathValue("pool"), r.PathValue("id")
	if _, err := s.ops.Agent(r.Context(), pool, id); err == nil {
		_ = s.ops.DrainAgent(r.Context(), pool, id)
	} else if ops.CodeOf(err) != ops.CodeNotFound {
		return err
	}
	msg, err := s.ops.FailoverAgent(r.Context(), pool, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"pool": pool, "agent": id, "result": msg})
	return nil
}

func (s *Server) taskQueues(w http.ResponseWriter, r *http.Request) error {
	q, err := s.ops.Queues(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, q)
	return nil
}

// listDeadLetters: ?after=ID&limit=N, summaries oldest first (no payload,
// no headers: GET /queues/dead-letters/{id} has them). limit 0 is the
// most a page holds (ops.MaxLetterPage); the next page is after= the
// last id of this one.
func (s *Server) listDeadLetters(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, err := limitUpTo(r, 100, ops.MaxLetterPage, "the most")
	if err != nil {
		return err
	}
	var after uint64
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return ops.Errorf(ops.CodeInvalid, "after %q: want a dead letter id (the last of the previous page)", v)
		}
		after = n
	}
	ls, err := s.ops.DeadLetterPage(r.Context(), after, limit)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ls)
	return nil
}

func (s *Server) showDeadLetter(w http.ResponseWriter, r *http.Request) error {
	id, err := letterID(r)
	if err != nil {
		return err
	}
	l, err := s.ops.DeadLetter(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, l)
	return nil
}

func (s *Server) retryDeadLetter(w http.ResponseWriter, r *http.Request) error {
	id, err := letterID(r)
	if err != nil {
		return err
	}
	l, err := s.ops.RetryDeadLetter(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"retried": l.ID, "job_id": l.JobID, "step_id": l.StepID})
	return nil
}

// purgeDeadLetters needs ?confirm=yes, as the CLI needs --yes.
func (s *Server) purgeDeadLetters(w http.ResponseWriter, r *http.Request) error {
	if r.URL.Query().Get("confirm") != "yes" {
		return ops.Errorf(ops.CodeInvalid, "purge deletes every dead letter for good: add ?confirm=yes")
	}
	n, err := s.ops.PurgeDeadLetters(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]uint64{"purged": n})
	return nil
}

func (s *Server) eventList(kind protocol.EventKind) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		limit, err := limitParam(r, 100)
		if err != nil {
			return err
		}
		evs, err := s.ops.Events(r.Context(), kind, limit)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, evs)
		return nil
	}
}

func (s *Server) healingStatus(w http.ResponseWriter, r *http.Request) error {
	st, err := s.ops.Health(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

func limitParam(r *http.Request, def int) (int, error) {
	return limitUpTo(r, def, events.MaxList, "the most")
}

// limitUpTo reads ?limit= as 0 to most; 0 means zero (what the route
// says it means: "all", "the most").
func limitUpTo(r *http.Request, def, most int, zero string) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > most {
		return 0, ops.Errorf(ops.CodeInvalid, "limit %q: want 0 (%s) to %d", v, zero, most)
	}
	return n, nil
}

// timeParam reads the query parameter name as an RFC 3339 time; the zero
// time if it is absent. A URL's query decodes + to a space, so a time
// written into a URL as it is, its offset's + unencoded
// (created_after=2026-11-27T10:00:00+01:00), arrives as
// "2026-11-27T10:00:00 01:00". A single space is read as that +: an RFC
// 3339 time has a + nowhere but in its offset, so the repaired value
// parses only if the space stood for the offset's sign.
func timeParam(q url.Values, name string) (time.Time, error) {
	v := q.Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil && strings.Count(v, " ") == 1 {
		t, err = time.Parse(time.RFC3339Nano, strings.Replace(v, " ", "+", 1))
	}
	if err != nil {
		return time.Time{}, ops.Errorf(ops.CodeInvalid,
			"%s %q: want an RFC 3339 time such as 2026-11-27T10:00:00Z or 2026-11-27T10:00:00+01:00", name, v)
	}
	return t, nil
}

func letterID(r *http.Request) (uint64, error) {
	id, err := dlq.ParseID(r.PathValue("id"))
	if err != nil {
		return 0, &ops.Error{Code: ops.CodeInvalid, Err: err}
	}
	return id, nil
}

func (s *Server) listClusters(w http.ResponseWriter, r *http.Request) error {
	cs, err := s.ops.Clusters(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, cs)
	return nil
}

// showCluster: the definition, members with their roles and health, and
// the cluster's status.
func (s *Server) showCluster(w http.ResponseWriter, r *http.Request) error {
	c, err := s.ops.Cluster(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, c)
	return nil
}

func (s *Server) putCluster(create bool) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		var d protocol.ClusterDefinition
		if err := decodeBody(r.Body, &d, "cluster definition"); err != nil {
			return err
		}
		st := http.StatusCreated
		if !create {
			if d.Name == "" {
				d.Name = r.PathValue("name")
			}
			if d.Name != r.PathValue("name") {
				return ops.Errorf(ops.CodeInvalid, "name %q differs from the path's %q", d.Name, r.PathValue("name"))
			}
			if _, err := s.ops.Cluster(r.Context(), d.Name); err != nil {
				return err
			}
			st = http.StatusOK
		}
		d, err := s.ops.PutCluster(r.Context(), d, create)
		if err != nil {
			return err
		}
		writeJSON(w, st, d)
		return nil
	}
}

func (s *Server) deleteCluster(w http.ResponseWriter, r *http.Request) error {
	if err := s.ops.DeleteCluster(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"deleted": r.PathValue("name")})
	return nil
}

// clusterRequest: the body, optional, is {"from", "to", "reason"}.
func (s *Server) clusterRequest(op string) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		req := protocol.ClusterRequest{Op: op}
		if r.ContentLength != 0 {
			var b struct {
				From   string `json:"from"`
				To     string `json:"to"`
				Reason string `json:"reason"`
			}
			if err := decodeBody(r.Body, &b, "request"); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			req.From, req.To, req.Reason = b.From, b.To, b.Reason
		}
		id, err := s.ops.ClusterRequest(r.Context(), r.PathValue("name"), req)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusAccepted, map[string]string{"cluster": r.PathValue("name"), "op": op, "request_id": id})
		return nil
	}
}

// decodeBody decodes the one JSON value of body into v: an unknown
// field or anything after the value is an error (job specs are read so
// too; a typo, "form" for "from", asked for a failover from no member, as
// if none had been named). io.EOF for an empty body; a body that did not
// arrive is bodyError's; anything else is invalid_argument, naming what.
func decodeBody(body io.Reader, v any, what string) error {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); !errors.Is(terr, io.EOF) {
			err = terr
			if err == nil {
				err = errors.New("data after the JSON value")
			}
		}
	}
	switch {
	case err == nil, err == io.EOF: // io.EOF: no value at all
		return err
	case isTransport(err):
		return bodyError(err)
	}
	return &ops.Error{Code: ops.CodeInvalid, Msg: "malformed " + what + " (JSON)", Err: err}
}
