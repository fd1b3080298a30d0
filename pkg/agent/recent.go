package agent

import (
	"container/list"
	"encoding/json"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/wardenhq/warden/pkg/protocol"
)

// recentReports remembers the results this agent stored most recently, by
// dispatch and attempt ("<job>.<step>.<epoch>.<attempt>", reportKey), so
// that a task that comes again is not run again. It comes again when the
// scheduler or the supervisor publishes a dispatch again (past the task
// stream's duplicate window, or after a server restart that forgot it,
// the stream stores it as a new message), when the ack was lost (the
// server restarted between the result and the ack, or forgot the
// in-memory task consumer the ack was for), or when a re-created consumer
// delivers afresh. Its result is already in WARDEN_RESULTS: the agent
// publishes it again, byte for byte, and acks the task. The scheduler
// takes the copy as the same result (the stream drops it as a duplicate
// of its Nats-Msg-Id within 2 min; later, alreadyApplied matches its
// epoch, status and finished_at), and a result that was lost is restored.
// Running the task again would be a second execution of its action for
// the scheduler to fence.
//
// A key never matches another dispatch (a new epoch), another attempt,
// or another lease token: those run.
//
// Bounds: the last recentReportsKept results; each for recentReportsFor
// after it was stored, or until its task's deadline if that is later (a
// task that arrives past its deadline is not run anyway: planTask
// dead-letters it, so forgetting it then never makes a second run); and
// result bodies of at most recentReportBytes in all, the oldest dropped
// first. A result whose body was dropped is still known: its task is acked
// unrun, without the copy.
type recentReports struct {
	mu       sync.Mutex
	kept     int
	maxBytes int
	bytes    int        // of the bodies held
	order    *list.List // of *reportEntry, the oldest first
	// bodied is the oldest entry still holding its body: the ones before
	// it dropped theirs (maxBytes), so the bound is kept without walking
	// them at every add.
	bodied *list.Element
	byKey  map[string]*list.Element
	byStep map[string]*list.Element // "<job>.<step>" -> its latest
}

// reportEntry is one stored result (recentReports).
type reportEntry struct {
	key, step string
	epoch     uint64
	attempt   int
	token     string
	failed    bool
	until     time.Time
	subject   string
	header    nats.Header
	data      []byte // nil once dropped to stay within maxBytes
}

// Bounds of recentReports. 4,096 results are far more than an agent
// finishes in the time any second delivery takes: the scheduler publishes
// a task again only within 90 s of its dispatch (republishWithin), the
// task stream's duplicate window is 2 min, and a lost ack is redelivered
// after one lease (10 s by default). Five minutes covers all three with
// room to spare. 16 MiB of bodies is 64 results of the largest
// max_result_bytes (256 KiB), thousands of typical ones.
const (
	recentReportsKept = 4096
	recentReportsFor  = 5 * time.Minute
	recentReportBytes = 16 << 20
)

func newRecentReports(kept, maxBytes int) *recentReports {
	return &recentReports{kept: kept, maxBytes: maxBytes, order: list.New(),
		byKey: make(map[string]*list.Element), byStep: make(map[string]*list.Element)}
}

// reportKey names a dispatch's attempt: "<job>.<step>.<epoch>.<attempt>".
func reportKey(t protocol.Task) string {
	return protocol.TaskMsgID(t.JobID, t.StepID, t.Epoch) + "." + strconv.Itoa(t.Attempt)
}

// add remembers the result m, stored at now for task t, whose deadline is
// deadline (zero: none).
func (r *recentReports) add(t protocol.Task, res protocol.Result, m *nats.Msg, deadline, now time.Time) {
	e := &reportEntry{key: reportKey(t), step: t.JobID + "." + t.StepID, epoch: t.Epoch,
		attempt: t.Attempt, token: t.Token, failed: res.Status == protocol.ResultFailed,
		until: now.Add(recentReportsFor), subject: m.Subject, header: m.Header, data: m.Data} // m is the agent's no more
	if deadline.After(e.until) {
		e.until = deadline
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.byKey[e.key]; ok {
		r.remove(old)
	}
	el := r.order.PushBack(e)
	r.byKey[e.key], r.byStep[e.step] = el, el
	r.bytes += len(e.data)
	if r.bodied == nil {
		r.bodied = el
	}
	for f := r.order.Front(); f != nil && f != el; f = r.order.Front() {
		if r.order.Len() <= r.kept && !f.Value.(*reportEntry).until.Before(now) {
			break
		}
		r.remove(f)
	}
	for ; r.bodied != nil && r.bytes > r.maxBytes; r.bodied = r.bodied.Next() {
		old := r.bodied.Value.(*reportEntry)
		r.bytes -= len(old.data)
		old.data = nil
	}
}

// remove forgets el; r.mu is held.
func (r *recentReports) remove(el *list.Element) {
	if r.bodied == el {
		r.bodied = el.Next()
	}
	e := r.order.Remove(el).(*reportEntry)
	delete(r.byKey, e.key)
	if r.byStep[e.step] == el {
		delete(r.byStep, e.step)
	}
	r.bytes -= len(e.data)
}

// get returns the result stored for task t, if it is remembered at now:
// the same dispatch, attempt and lease token. msg is nil if its body was
// dropped (recentReportBytes).
func (r *recentReports) get(t protocol.Task, now time.Time) (msg *nats.Msg, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	el, ok := r.byKey[reportKey(t)]
	if !ok {
		return nil, false
	}
	e := el.Value.(*reportEntry)
	if e.until.Before(now) {
		r.remove(el)
		return nil, false
	}
	if e.token != t.Token {
		return nil, false
	}
	if e.data == nil {
		return nil, true
	}
	// A message of its own: publishing one message twice at once (two
	// more deliveries together) would share its header map.
	return &nats.Msg{Subject: e.subject, Header: maps.Clone(e.header), Data: e.data}, true
}

// previousError is the error this agent reported for the attempt of t's
// step before t's (its attempt less one, an earlier epoch), if it is
// remembered at now with its body.
func (r *recentReports) previousError(t protocol.Task, now time.Time) (string, bool) {
	r.mu.Lock()
	el, ok := r.byStep[t.JobID+"."+t.StepID]
	var data []byte
	if ok {
		e := el.Value.(*reportEntry)
		if e.failed && e.attempt == t.Attempt-1 && e.epoch < t.Epoch && !e.until.Before(now) {
			data = e.data
		}
	}
	r.mu.Unlock()
	if data == nil {
		return "", false
	}
	var res protocol.Result
	if err := json.Unmarshal(data, &res); err != nil || res.Error == "" {
		return "", false
	}
	return res.Error, true
}
