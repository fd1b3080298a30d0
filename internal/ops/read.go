package ops

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/dlq"
	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/health"
	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
)

// SubmitJob validates and submits a job spec (YAML or JSON) and waits,
// bounded, for a scheduler to confirm it (client.Client.Submit).
func (o *Ops) SubmitJob(ctx context.Context, body []byte) (client.Receipt, error) {
	return o.client().Submit(ctx, body, client.SubmitOptions{ReplyTimeout: o.replyTimeout})
}

// Job reads a job with its steps in spec order; each step carries its
// attempts (the retry chain), and never its lease token (client.Job): the
// read endpoints serve it to the read scope, anonymous readers included.
func (o *Ops) Job(ctx context.Context, id string) (client.JobDetail, error) {
	if !protocol.ValidToken(id) {
		return client.JobDetail{}, Errorf(CodeNotFound, "job %q: not found", id)
	}
	return o.client().Job(ctx, id)
}

// Agent is an agent's presence with the supervisor's latest assessment.
type Agent struct {
	protocol.Presence
	// Health is nil until a supervisor leader assessed the agent.
	Health *health.Record `json:"health,omitempty"`
	// HeartbeatAgeSeconds is how long ago the agent last announced itself.
	HeartbeatAgeSeconds float64 `json:"heartbeat_age_seconds"`
	// Load is in_flight / max_concurrent.
	Load float64 `json:"load"`
}

// Agents lists the agents present now, by pool then id.
func (o *Ops) Agents(ctx context.Context) ([]Agent, error) {
	ps, err := presence.List(ctx, o.js)
	if err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	// Assessments exist once a supervisor leader has run.
	records, _ := health.ListRecords(ctx, o.js)
	now := o.now()
	out := make([]Agent, 0, len(ps))
	for _, p := range ps {
		a := Agent{Presence: p, HeartbeatAgeSeconds: max(now.Sub(p.HeartbeatAt).Seconds(), 0)}
		if p.MaxConcurrent > 0 {
			a.Load = float64(p.InFlight) / float64(p.MaxConcurrent)
		}
		if r, ok := records[protocol.PresenceKey(p.Pool, p.ID)]; ok {
			a.Health = &r
		}
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Pool != out[j].Pool {
			return out[i].Pool < out[j].Pool
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// Agent returns one present agent.
func (o *Ops) Agent(ctx context.Context, pool, id string) (Agent, error) {
	if !protocol.ValidToken(pool) || !protocol.ValidToken(id) {
		return Agent{}, Errorf(CodeNotFound, "agent %s.%s: not found", pool, id)
	}
	all, err := o.Agents(ctx)
	if err != nil {
		return Agent{}, err
	}
	for _, a := range all {
		if a.Pool == pool && a.ID == id {
			return a, nil
		}
	}
	return Agent{}, Errorf(CodeNotFound, "agent %s.%s: not present", pool, id)
}

// HealthStatus is every agent's assessment, with counts by level.
type HealthStatus struct {
	Agents  []health.Record `json:"agents"`
	ByLevel map[string]int  `json:"by_level"`
}

// Health returns the supervisor leader's latest assessments.
func (o *Ops) Health(ctx context.Context) (HealthStatus, error) {
	records, err := health.ListRecords(ctx, o.js)
	if err != nil {
		return HealthStatus{}, err
	}
	st := HealthStatus{Agents: []health.Record{}, ByLevel: map[string]int{}}
	for _, r := range records {
		st.Agents = append(st.Agents, r)
		st.ByLevel[r.Level.String()]++
	}
	sort.Slice(st.Agents, func(i, j int) bool { return st.Agents[i].Key() < st.Agents[j].Key() })
	return st, nil
}

// Events returns the last limit stored events of a kind (healing,
// failover, dead_lettered, ...), oldest first; at most 10,000 (0: that
// many).
func (o *Ops) Events(ctx context.Context, kind protocol.EventKind, limit int) ([]protocol.Event, error) {
	if !protocol.ValidToken(string(kind)) {
		return nil, Errorf(CodeInvalid, "event kind %q: not a valid token", kind)
	}
	evs, err := events.List(ctx, o.js, kind, limit) // at most events.MaxList
	if err != nil {
		return nil, err
	}
	if evs == nil {
		evs = []protocol.Event{}
	}
	return evs, nil
}

// TaskQueue is one task shard stream: what waits in it, by subject.
type TaskQueue struct {
	Stream string `json:"stream"`
	// Messages are tasks stored (waiting or in flight).
	Messages uint64 `json:"messages"`
	// Subjects counts stored tasks by pool and agent ("any" for a pool's
	// shared queue).
	Subjects []QueueSubject `json:"subjects"`
	// Consumers is the number of agent consumers on the shard.
	Consumers int `json:"consumers"`
}

// QueueSubject is the depth of one task subject.
type QueueSubject struct {
	Pool     string `json:"pool"`
	Agent    string `json:"agent"`
	Messages uint64 `json:"messages"`
}

// Queues is the state of the task and dead-letter queues.
type Queues struct {
	Tasks []TaskQueue `json:"tasks"`
	// TasksTotal sums the task streams' messages.
	TasksTotal uint64 `json:"tasks_total"`
	// DeadLetters is the number of dead letters stored.
	DeadLetters uint64 `json:"dead_letters"`
}

// Queues reads the task shard streams and the dead-letter stream.
func (o *Ops) Queues(ctx context.Context) (Queues, error) {
	q := Queues{Tasks: []TaskQueue{}}
	names := o.js.StreamNames(ctx, jetstream.WithStreamListSubject(protocol.SubjectTaskPrefix+".>"))
	var streams []string
	for n := range names.Name() {
		if strings.HasPrefix(n, protocol.StreamTasksPrefix) {
			streams = append(streams, n)
		}
	}
	if err := names.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return q, fmt.Errorf("list task streams: %w", err)
	}
	sort.Slice(streams, func(i, j int) bool {
		a, _ := strconv.Atoi(strings.TrimPrefix(streams[i], protocol.StreamTasksPrefix))
		b, _ := strconv.Atoi(strings.TrimPrefix(streams[j], protocol.StreamTasksPrefix))
		return a < b
	})
	for _, n := range streams {
		s, err := o.js.Stream(ctx, n)
		if err != nil {
			return q, fmt.Errorf("read %s: %w", n, err)
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(protocol.SubjectTaskPrefix+".>"))
		if err != nil {
			return q, fmt.Errorf("read %s: %w", n, err)
		}
		// Messages counts tasks only: the stream also holds its anchor
		// (protocol.AnchorSubject), outside the filter.
		tq := TaskQueue{Stream: n, Consumers: info.State.Consumers, Subjects: []QueueSubject{}}
		for subj, c := range info.State.Subjects {
			tq.Messages += c
			// warden.task.<shard>.<pool>.<agent>
			parts := strings.Split(subj, ".")
			if len(parts) != 5 {
				continue
			}
			tq.Subjects = append(tq.Subjects, QueueSubject{Pool: parts[3], Agent: parts[4], Messages: c})
		}
		sort.Slice(tq.Subjects, func(i, j int) bool {
			a, b := tq.Subjects[i], tq.Subjects[j]
			return a.Pool < b.Pool || (a.Pool == b.Pool && a.Agent < b.Agent)
		})
		q.Tasks = append(q.Tasks, tq)
		q.TasksTotal += tq.Messages
	}
	if s, err := o.js.Stream(ctx, protocol.StreamDLQ); err == nil {
		q.DeadLetters = s.CachedInfo().State.Msgs
	}
	return q, nil
}

// Overview is the dashboard's first screen.
type Overview struct {
	Jobs        map[jobstore.JobState]int `json:"jobs"`
	JobsTotal   int                       `json:"jobs_total"`
	Agents      int                       `json:"agents"`
	AgentLevels map[string]int            `json:"agent_levels"`
	QueueDepth  uint64                    `json:"queue_depth"`
	DeadLetters uint64                    `json:"dead_letters"`
	Time        time.Time                 `json:"time"`
}

// Overview counts jobs by state (from record headers), agents, queued tasks
// and dead letters.
func (o *Ops) Overview(ctx context.Context) (Overview, error) {
	ov := Overview{Jobs: map[jobstore.JobState]int{}, AgentLevels: map[string]int{}, Time: o.now().UTC()}
	// The job counts of a listing (every job by state): from the API's
	// job index when it is current (jobstore.Index), else a scan of the
	// job headers, as before; the one job of the page is a single read.
	p, err := o.store.List(ctx, o.js, jobstore.ListFilter{Limit: 1})
	if err != nil {
		return ov, err
	}
	for st, n := range p.Counts {
		if n > 0 {
			ov.Jobs[st] = n
			ov.JobsTotal += n
		}
	}
	agents, err := o.Agents(ctx)
	if err != nil {
		return ov, err
	}
	ov.Agents = len(agents)
	for _, a := range agents {
		lvl := "unknown"
		if a.Health != nil {
			lvl = a.Health.Level.String()
		}
		ov.AgentLevels[lvl]++
	}
	q, err := o.Queues(ctx)
	if err != nil {
		return ov, err
	}
	ov.QueueDepth, ov.DeadLetters = q.TasksTotal, q.DeadLetters
	return ov, nil
}

// DeadLetter returns one dead letter.
func (o *Ops) DeadLetter(ctx context.Context, id uint64) (dlq.Letter, error) {
	q, err := o.dlq(ctx)
	if err != nil {
		return dlq.Letter{}, err
	}
	return q.Get(ctx, id)
}

// RetryDeadLetter puts the letter's step back with a fresh attempt budget
// and removes the letter (dlq.Queue.Retry).
func (o *Ops) RetryDeadLetter(ctx context.Context, id uint64) (dlq.Letter, error) {
	q, err := o.dlq(ctx)
	if err != nil {
		return dlq.Letter{}, err
	}
	return q.Retry(ctx, o.store, id)
}

// PurgeDeadLetters deletes every dead letter and says how many there were.
func (o *Ops) PurgeDeadLetters(ctx context.Context) (uint64, error) {
	q, err := o.dlq(ctx)
	if err != nil {
		return 0, err
	}
	return q.Purge(ctx)
}

func (o *Ops) dlq(ctx context.Context) (*dlq.Queue, error) {
	q, err := dlq.Open(ctx, o.nc, o.js)
	if err != nil {
		return nil, &Error{Code: CodeUnavailable, Err: err}
	}
	return q, nil
}

func (o *Ops) client() *client.Client {
	return client.New(o.js, client.Options{ReplyTimeout: o.replyTimeout})
}
