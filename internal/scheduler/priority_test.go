package scheduler

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/internal/selection"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// The backlog's decisions, without a server: what take and arrived do is
// pure bookkeeping under one lock; TestHighPriorityOvertakesBacklog
// (workflow_test.go) shows the order end to end.

// anyClass is a step whose agent the backlog cannot know (as a cluster
// step's): any higher step waiting for its pool holds it back.
var anyClass = slotClass{any: true}

// anyAgent adapts a choice that ignores the agent the backlog allowed.
func anyAgent(f func() (protocol.Presence, error)) func(string) (protocol.Presence, error) {
	return func(string) (protocol.Presence, error) { return f() }
}

func backlogScheduler() *Scheduler {
	return &Scheduler{cfg: DefaultConfig(), metrics: NopMetrics{}}
}

// TestTakeIsBehindARegisteredHigherStep: once a high step waits for a
// pool, a low step's bid never reaches the selector, and waits itself;
// when the high step is gone, the low one bids.
func TestTakeIsBehindARegisteredHigherStep(t *testing.T) {
	t.Parallel()
	s := backlogScheduler()
	now := time.Now()
	atCapacity := func() (protocol.Presence, error) { return protocol.Presence{}, selection.ErrAtCapacity }
	if _, err := s.take("high.s", "default", anyClass, spec.PriorityHigh, now, nil, anyAgent(atCapacity)); !errors.Is(err, selection.ErrAtCapacity) {
		t.Fatalf("high at capacity: %v", err)
	}
	chose := false
	choose := func() (protocol.Presence, error) { chose = true; return protocol.Presence{ID: "a"}, nil }
	if _, err := s.take("low.s", "default", anyClass, spec.PriorityLow, now, nil, anyAgent(choose)); !errors.Is(err, errBehind) || chose {
		t.Fatalf("low bid beside a waiting high one: err %v, chose %v", err, chose)
	}
	if _, ok := s.backlog.entries["low.s"]; !ok {
		t.Fatal("a low step held back is not registered as waiting")
	}
	// Another pool is not held back.
	if _, err := s.take("other.s", "gpu", anyClass, spec.PriorityLow, now, nil, anyAgent(choose)); err != nil || !chose {
		t.Fatalf("low step of another pool: err %v, chose %v", err, chose)
	}
	chose = false
	if a, err := s.take("high.s", "default", anyClass, spec.PriorityHigh, now, nil, anyAgent(choose)); err != nil || a.ID != "a" {
		t.Fatalf("high bid: %v", err)
	}
	if _, ok := s.backlog.entries["high.s"]; ok {
		t.Fatal("a dispatched step still registered")
	}
	chose = false
	if _, err := s.take("low.s", "default", anyClass, spec.PriorityLow, now, nil, anyAgent(choose)); err != nil || !chose {
		t.Fatalf("low bid after the high one left: err %v, chose %v", err, chose)
	}
	// A step no agent can take (none offers its action) holds no one back.
	noAgent := func() (protocol.Presence, error) { return protocol.Presence{}, selection.ErrNoAgent }
	if _, err := s.take("high2.s", "default", anyClass, spec.PriorityHigh, now, nil, anyAgent(noAgent)); !errors.Is(err, selection.ErrNoAgent) {
		t.Fatal(err)
	}
	if s.behind("low2.s", "default", anyClass, spec.PriorityLow, now, nil) {
		t.Fatal("a step waiting for no agent holds back others")
	}
}

// TestAgedLowStepIsNoLongerBehind: the guard against starvation. A low
// step that has waited 2 × aging competes as high (ties are not behind),
// at 3 × aging as critical.
func TestAgedLowStepIsNoLongerBehind(t *testing.T) {
	t.Parallel()
	s := backlogScheduler()
	aging := s.cfg.PriorityAging.Std()
	start := time.Now()
	atCapacity := func() (protocol.Presence, error) { return protocol.Presence{}, selection.ErrAtCapacity }
	s.take("high.s", "default", anyClass, spec.PriorityHigh, start, nil, anyAgent(atCapacity))
	if _, err := s.take("low.s", "default", anyClass, spec.PriorityLow, start, nil, anyAgent(atCapacity)); !errors.Is(err, errBehind) {
		t.Fatalf("fresh low step: %v", err)
	}
	if !s.behind("low.s", "default", anyClass, spec.PriorityLow, start.Add(aging), nil) {
		t.Fatal("a low step aged one level (normal) is not behind a high one")
	}
	if _, err := s.take("low.s", "default", anyClass, spec.PriorityLow, start.Add(2*aging), nil, anyAgent(atCapacity)); !errors.Is(err, selection.ErrAtCapacity) {
		t.Fatalf("a low step aged to high still behind a high one: %v", err)
	}
	s.take("crit.s", "default", anyClass, spec.PriorityCritical, start.Add(2*aging), nil, anyAgent(atCapacity))
	if _, err := s.take("low.s", "default", anyClass, spec.PriorityLow, start.Add(3*aging), nil, anyAgent(atCapacity)); !errors.Is(err, selection.ErrAtCapacity) {
		t.Fatalf("a low step aged to critical still behind a critical one: %v", err)
	}
}

// TestArrivalRegistersUnderBacklog: a submission received while steps wait
// for its pool is registered at once, before its worker's turn, so a low
// step bidding in the meantime is behind it; without a backlog, or for a
// delayed submission or a redelivery, nothing is registered.
func TestArrivalRegistersUnderBacklog(t *testing.T) {
	t.Parallel()
	s := backlogScheduler()
	now := time.Now()
	high := []byte(`{"name":"h","priority":"high","steps":[{"id":"a","action":"echo"},{"id":"b","action":"echo","depends_on":["a"]}]}`)
	arrive := func(in input) { s.arrived(&in) }
	arrive(submission("early", high, now, 1))
	if len(s.backlog.entries) != 0 {
		t.Fatal("registered without a backlog")
	}
	atCapacity := func() (protocol.Presence, error) { return protocol.Presence{}, selection.ErrAtCapacity }
	s.take("waiting.s", "default", anyClass, spec.PriorityLow, now, nil, anyAgent(atCapacity))
	arrive(submission("again", high, now, 2))
	arrive(submission("later", []byte(`{"name":"h","priority":"high","delay":"1m","steps":[{"id":"a","action":"echo"}]}`), now, 1))
	arrive(submission("bad", []byte(`{"name":"h","priority":"high","steps":[]}`), now, 1))
	if len(s.backlog.entries) != 1 {
		t.Fatalf("registered a redelivery, a delayed or a rejected submission: %v", s.backlog.entries)
	}
	arrive(submission("job-h", high, now, 1))
	if _, ok := s.backlog.entries["job-h.a"]; !ok {
		t.Fatal("the ready step of a submission under backlog is not registered")
	}
	if _, ok := s.backlog.entries["job-h.b"]; ok {
		t.Fatal("a step that is not ready yet is registered")
	}
	if _, err := s.take("low.s", "default", anyClass, spec.PriorityLow, now, nil, anyAgent(atCapacity)); !errors.Is(err, errBehind) {
		t.Fatalf("a low step bids ahead of a high one that arrived before it: %v", err)
	}
	s.stopWaiting("job-h.a")
	if _, err := s.take("low.s", "default", anyClass, spec.PriorityLow, now, nil, anyAgent(atCapacity)); !errors.Is(err, selection.ErrAtCapacity) {
		t.Fatalf("still behind once the high step is forgotten: %v", err)
	}
}

// submission is a submission message as a scheduler's consumer hands it
// over, delivered the given number of times.
func submission(job string, body []byte, at time.Time, delivered uint64) input {
	m := &fakeMsg{subject: protocol.SubmitSubject(job), data: body, header: nats.Header{},
		md: &jetstream.MsgMetadata{NumDelivered: delivered, Timestamp: at}}
	return input{kind: inSubmit, job: job, msg: m, at: at}
}

type fakeMsg struct {
	jetstream.Msg // methods the backlog does not call panic
	subject       string
	data          []byte
	header        nats.Header
	md            *jetstream.MsgMetadata
}

func (m *fakeMsg) Subject() string                           { return m.subject }
func (m *fakeMsg) Data() []byte                              { return m.data }
func (m *fakeMsg) Headers() nats.Header                      { return m.header }
func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) { return m.md, nil }

// TestBehindOnlyForAnAgentTheHigherWorkCouldUse: a high step waits for
// agents with a gpu; a low step whose agent has none takes it, on that
// agent; one whose agent has a gpu waits behind the high step.
func TestBehindOnlyForAnAgentTheHigherWorkCouldUse(t *testing.T) {
	t.Parallel()
	s := backlogScheduler()
	now := time.Now()
	gpuClass := slotClass{req: selection.Request{Pool: "default", Action: "echo", Requires: []string{"gpu"}}}
	lowClass := slotClass{req: selection.Request{Pool: "default", Action: "echo"}}
	atCapacity := func(string) (protocol.Presence, error) { return protocol.Presence{}, selection.ErrAtCapacity }
	if _, err := s.take("high.s", "default", gpuClass, spec.PriorityHigh, now, nil, atCapacity); !errors.Is(err, selection.ErrAtCapacity) {
		t.Fatalf("high at capacity: %v", err)
	}
	plain := protocol.Presence{ID: "plain", Pool: "default", Actions: []string{"echo"}}
	withGPU := protocol.Presence{ID: "gpu-2", Pool: "default", Actions: []string{"echo"}, Capabilities: []string{"gpu"}}
	var on string
	choose := func(agent string) (protocol.Presence, error) { on = agent; return protocol.Presence{ID: agent}, nil }
	peek := func(p protocol.Presence) func() (protocol.Presence, error) {
		return func() (protocol.Presence, error) { return p, nil }
	}
	if s.behind("low.s", "default", lowClass, spec.PriorityLow, now, peek(plain)) {
		t.Fatal("a low step whose agent the high one cannot use is behind it")
	}
	if a, err := s.take("low.s", "default", lowClass, spec.PriorityLow, now, peek(plain), choose); err != nil || a.ID != "plain" || on != "plain" {
		t.Fatalf("low step beside a high one that cannot use its agent: %v, %v, chosen on %q", a, err, on)
	}
	on = "unset"
	if _, err := s.take("low2.s", "default", lowClass, spec.PriorityLow, now, peek(withGPU), choose); !errors.Is(err, errBehind) || on != "unset" {
		t.Fatalf("low step whose agent the high one could use: %v (chosen on %q)", err, on)
	}
	// A pinned high step holds back only its own agent.
	pinned := slotClass{req: selection.Request{Pool: "default", Agent: "plain", Action: "echo"}}
	s.take("high-pinned.s", "default", pinned, spec.PriorityHigh, now, nil, atCapacity)
	if !s.behind("low3.s", "default", lowClass, spec.PriorityLow, now, peek(plain)) {
		t.Fatal("a low step is not behind a high step pinned to the agent it would get")
	}
	// An unknown agent (a cluster step, or a failed look) is behind any
	// higher step waiting for the pool.
	failed := func() (protocol.Presence, error) { return protocol.Presence{}, selection.ErrNoAgent }
	if !s.behind("low4.s", "default", lowClass, spec.PriorityLow, now, failed) {
		t.Fatal("a step whose agent is unknown is not behind higher work waiting for its pool")
	}
}

// An unknown priority (a record of a newer version) competes as normal
// (spec.Priority.EffectiveRank, the concurrency limiter's queues), and is
// counted as normal where others are counted at their base rank; it was
// counted as low there.
func TestUnknownPriorityRanksAsNormalThroughout(t *testing.T) {
	t.Parallel()
	const unknown = spec.Priority("urgent")
	if got, want := baseRank(unknown), spec.PriorityNormal.Rank(); got != want {
		t.Errorf("baseRank(%q) = %d, want normal's %d", unknown, got, want)
	}
	if got, want := baseRank(unknown), unknown.EffectiveRank(0, time.Minute); got != want {
		t.Errorf("baseRank(%q) = %d, its effective rank unaged %d", unknown, got, want)
	}
}
