package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/protocol"
)

// NATS micro services: the facade's operations as request-reply endpoints
// that `nats micro ls|info|stats` list. Each Warden process registers one
// service, warden-<process>; its endpoints answer on
//
//	warden.ops.<process>.<group>.<op>         read operations
//	warden.ops.<process>.admin.<group>.<op>   admin operations (API only)
//
// so NATS permissions can grant reading without acting. A request body is
// JSON (empty for none); a reply is the operation's JSON, or an error whose
// Nats-Service-Error-Code is the HTTP status of the ops.Code and whose body
// is the API's error shape ({"error": {"code", "message", "status"}}).

// Service names.
const (
	ServiceAPI        = "api"
	ServiceScheduler  = "scheduler"
	ServiceSupervisor = "supervisor"
)

// Version is reported by the micro services.
var Version = "0.1.0"

// MicroSubjectPrefix starts every endpoint subject.
const MicroSubjectPrefix = "warden.ops"

// microRequest is the union of the endpoints' request fields.
type microRequest struct {
	ID      string   `json:"id"`
	Pool    string   `json:"pool"`
	States  []string `json:"states"`
	Since   string   `json:"since"`
	Limit   int      `json:"limit"`
	Cursor  string   `json:"cursor"`
	After   uint64   `json:"after"`
	Confirm string   `json:"confirm"`
}

type endpoint struct {
	group, op, desc string
	admin           bool
	// raw passes the request body untouched (a job spec).
	raw bool
	f   func(ctx context.Context, o *Ops, req microRequest, raw []byte) (any, error)
}

func endpoints() []endpoint {
	return []endpoint{
		{group: "overview", op: "get", desc: "jobs by state, agents by level, queue and dead-letter depth",
			f: func(ctx context.Context, o *Ops, _ microRequest, _ []byte) (any, error) { return o.Overview(ctx) }},
		{group: "jobs", op: "list", desc: `a page of jobs: {"states", "since", "limit", "cursor"}`,
			f: func(ctx context.Context, o *Ops, r microRequest, _ []byte) (any, error) {
				f := jobstore.ListFilter{Limit: r.Limit, Cursor: r.Cursor}
				for _, s := range r.States {
					f.States = append(f.States, jobstore.JobState(s))
				}
				if r.Since != "" {
					d, err := time.ParseDuration(r.Since)
					if err != nil || d <= 0 {
						return nil, Errorf(CodeInvalid, "since %q: want a positive duration", r.Since)
					}
					f.CreatedAfter = o.now().Add(-d)
				}
				return o.ListJobs(ctx, f)
			}},
		{group: "jobs", op: "show", desc: `a job with its steps and attempts: {"id"}`,
			f: func(ctx context.Context, o *Ops, r microRequest, _ []byte) (any, error) { return o.Job(ctx, r.ID) }},
		{group: "agents", op: "list", desc: "present agents with health, load and heartbeat age",
			f: func(ctx context.Context, o *Ops, _ microRequest, _ []byte) (any, error) { return o.Agents(ctx) }},
		{group: "agents", op: "show", desc: `one agent: {"pool", "id"}`,
			f: func(ctx context.Context, o *Ops, r microRequest, _ []byte) (any, error) {
				return o.Agent(ctx, r.Pool, r.ID)
			}},
		{group: "queues", op: "tasks", desc: "task streams and their depth by pool and agent",
			f: func(ctx context.Context, o *Ops, _ microRequest, _ []byte) (any, error) { return o.Queues(ctx) }},
		{group: "dlq", op: "list", desc: `dead letter summaries, oldest first: {"after", "limit"} (the next page is after the last id)`,
			f: func(ctx context.Context, o *Ops, r microRequest, _ []byte) (any, error) {
				// Summaries, as the HTTP list serves: whole letters (a
				// task payload each) made a reply past max_payload.
				return o.DeadLetterPage(ctx, r.After, min(defaultLimit(r.Limit), MaxLetterPage))
			}},
		{group: "dlq", op: "show", desc: `one dead letter: {"id"}`,
			f: func(ctx context.Context, o *Ops, r microRequest, _ []byte) (any, error) {
				id, err := letterID(r.ID)
				if err != nil {
					return nil, err
				}
				return o.DeadLetter(ctx, id)
			}},
		{group: "healing", op: "actions", desc: `self-healing actions: {"limit"}`,
			f: func(ctx context.Context, o *Ops, r microRequest, _ []byte) (any, error) {
				return o.Events(ctx, protocol.EventHealing, defaultLimit(r.Limit))
			}},
		{group: "healing", op: "status", desc: "every agent's assessment",
			f: func(ctx context.Context, o *Ops, _ microRequest, _ []byte) (any, error) { return o.Health(ctx) }},
		{group: "failovers", op: "list", desc: `failover history: {"limit"}`,
			f: func(ctx context.Context, o *Ops, r microRequest, _ []byte) (any, error) {
				return o.Events(ctx, protocol.EventFailover, defaultLimit(r.Limit))
			}},

		{group: "jobs", op: "submit", admin: true, raw: true, desc: "submit a job spec (YAML or JSON body)",
			f: func(ctx context.Context, o *Ops, _ microRequest, raw []byte) (any, error) {
				return o.SubmitJob(ctx, raw)
			}},
		{group: "jobs", op: "cancel", admin: true, desc: `cancel a job: {"id"}`,
			f: func(ctx context.Context, o *Ops, r microRequest, _ []byte) (any, error) {
				return o.CancelJob(ctx, r.ID)
			}},
		{group: "jobs", op: "retry", admin: true, desc: `retry a finished job's failed steps: {"id"}`,
			f: func(ctx context.Context, o *Ops, r microRequest, _ []byte) (any, error) {
				steps, err := o.RetryJob(ctx, r.ID)
				return map[string]any{"job_id": r.ID, "reopened": steps}, err
			}},
		{group: "agents", op: "drain", admin: true, desc: `drain an agent: {"pool", "id"}`,
			f: func(ctx context.Context, o *Ops, r microRequest, _ []byte) (any, error) {
				return map[string]string{"result": "drained"}, o.DrainAgent(ctx, r.Pool, r.ID)
			}},
		{group: "agents", op: "undrain", admin: true, desc: `undrain an agent: {"pool", "id"}`,
			f: func(ctx context.Context, o *Ops, r microRequest, _ []byte) (any, error) {
				return map[string]string{"result": "undrained"}, o.UndrainAgent(ctx, r.Pool, r.ID)
			}},
		{group: "agents", op: "failover", admin: true, desc: `move an agent's queued tasks elsewhere: {"pool", "id"}`,
			f: func(ctx context.Context, o *Ops, r microRequest, _ []byte) (any, error) {
				_ = o.DrainAgent(ctx, r.Pool, r.ID)
				msg, err := o.FailoverAgent(ctx, r.Pool, r.ID)
				return map[string]string{"result": msg}, err
			}},
		{group: "dlq", op: "retry", admin: true, desc: `retry a dead letter: {"id"}`,
			f: func(ctx context.Context, o *Ops, r microRequest, _ []byte) (any, error) {
				id, err := letterID(r.ID)
				if err != nil {
					return nil, err
				}
				l, err := o.RetryDeadLetter(ctx, id)
				return map[string]any{"retried": l.ID, "job_id": l.JobID, "step_id": l.StepID}, err
			}},
		{group: "dlq", op: "purge", admin: true, desc: `purge every dead letter: {"confirm": "yes"}`,
			f: func(ctx context.Context, o *Ops, r microRequest, _ []byte) (any, error) {
				if r.Confirm != "yes" {
					return nil, Errorf(CodeInvalid, `purge deletes every dead letter for good: send {"confirm": "yes"}`)
				}
				n, err := o.PurgeDeadLetters(ctx)
				return map[string]uint64{"purged": n}, err
			}},
	}
}

// defaultLimit is a list request's limit: 100 when unset, at most
// events.MaxList (the HTTP API's bound too; each dead letter listed is a
// read of the stream).
func defaultLimit(n int) int {
	if n <= 0 {
		return 100
	}
	return min(n, maxLimit)
}

const maxLimit = events.MaxList

func letterID(s string) (uint64, error) {
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		return 0, Errorf(CodeInvalid, "dead letter id must be a positive number, got %q", s)
	}
	return id, nil
}

// MicroSubject is the subject of an endpoint of a process's service.
func MicroSubject(process, group, op string, admin bool) string {
	if admin {
		return fmt.Sprintf("%s.%s.admin.%s.%s", MicroSubjectPrefix, process, group, op)
	}
	return fmt.Sprintf("%s.%s.%s.%s", MicroSubjectPrefix, process, group, op)
}

// RegisterMicro registers the micro service warden-<process> on nc with the
// facade's read endpoints, and its admin endpoints when admin is set.
// Requests are bounded by timeout each. Stop the service when done.
func RegisterMicro(nc *nats.Conn, o *Ops, process string, admin bool) (micro.Service, error) {
	svc, err := micro.AddService(nc, micro.Config{
		Name:        "warden-" + process,
		Version:     Version,
		Description: "Warden " + process + ": operations on jobs, agents, queues and history (docs/api.md#nats-micro)",
		Metadata:    map[string]string{"process": process, "subjects": MicroSubjectPrefix + "." + process + ".>"},
	})
	if err != nil {
		return nil, err
	}
	for _, e := range endpoints() {
		if e.admin && !admin {
			continue
		}
		e := e
		name := e.group + "_" + e.op
		if e.admin {
			name = "admin_" + name
		}
		h := micro.HandlerFunc(func(req micro.Request) {
			if !protocol.ValidReplySubject(req.Reply()) {
				// The requester chose the subject; the answer would go out
				// with this process's permissions (protocol.ValidReplySubject).
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var r microRequest
			if !e.raw && len(req.Data()) > 0 {
				if err := json.Unmarshal(req.Data(), &r); err != nil {
					microError(req, &Error{Code: CodeInvalid, Msg: "malformed JSON request", Err: err})
					return
				}
			}
			v, err := e.f(ctx, o, r, req.Data())
			if err != nil {
				microError(req, err)
				return
			}
			_ = req.RespondJSON(v)
		})
		if err := svc.AddEndpoint(name, h,
			micro.WithEndpointSubject(MicroSubject(process, e.group, e.op, e.admin)),
			micro.WithEndpointMetadata(map[string]string{"description": e.desc, "scope": scopeName(e.admin)}),
		); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("endpoint %s: %w", name, err)
		}
	}
	return svc, nil
}

func scopeName(admin bool) string {
	if admin {
		return "admin"
	}
	return "read"
}

// microError answers with the error shape the HTTP API uses.
func microError(req micro.Request, err error) {
	c := CodeOf(err)
	st := c.HTTPStatus()
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"code": c, "message": err.Error(), "status": st}})
	_ = req.Error(strconv.Itoa(st), string(c)+": "+err.Error(), body)
}

// StartService registers the read-only micro service of a Warden process
// (scheduler, supervisor) on its connection: the scheduler and supervisor
// call it once from Run. The service stops when ctx ends. A failure is
// returned for logging; the process runs without the service.
func StartService(ctx context.Context, nc *nats.Conn, process string) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	store, err := jobstore.Open(ctx, js)
	if err != nil {
		return err
	}
	svc, err := RegisterMicro(nc, New(nc, store), process, false)
	if err != nil {
		return err
	}
	context.AfterFunc(ctx, func() { _ = svc.Stop() })
	return nil
}

// ServeMicro is StartService for a process's Run: a failure is logged and
// the process runs on without its micro service.
func ServeMicro(ctx context.Context, nc *nats.Conn, process string, log zerolog.Logger) {
	if err := StartService(ctx, nc, process); err != nil {
		log.Warn().Err(err).Str("service", "warden-"+process).Msg("micro service not registered")
	}
}
