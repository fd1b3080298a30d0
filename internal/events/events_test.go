package events_test

import (
	"context"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Issue 15: a deposed leader published a duplicate agent_failed event. Every
// event now carries a Nats-Msg-Id derived from what it describes (not from
// when, or by whom, it was published), so the stream stores a repeat once.
func TestEventsDescribedTwiceAreStoredOnce(t *testing.T) {
	t.Parallel()
	_, _, js := natstest.Start(t, streams.Options{})
	ctx := context.Background()
	p := events.NewPublisher(js)
	failed := protocol.Event{Kind: protocol.EventAgentFailed, ID: "a1", Agent: "a1", Reason: "presence expired",
		Data: map[string]string{"pool": "default", "trigger": "departed:t1"}}
	first, second := failed, failed
	first.Time, second.Time = time.Unix(1, 0), time.Unix(2, 0) // two leaders, two clocks
	recovered := func(epoch string) protocol.Event {
		return protocol.Event{Kind: protocol.EventStepRecovered, ID: "j", JobID: "j", StepID: "s", Agent: "a1",
			Reason: "lease expired", Data: map[string]string{"epoch": epoch}}
	}
	for _, e := range []protocol.Event{first, second, recovered("1"), recovered("1"), recovered("2")} {
		if err := p.Publish(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// A failover record measured twice (durations differ) is one failover.
	for _, d := range []string{"1ms", "2ms"} {
		e := protocol.Event{Kind: protocol.EventFailover, ID: "fo-1", Agent: "a1", Data: map[string]string{"duration": d}}
		if err := p.PublishOnce(ctx, e, "fo-1"); err != nil {
			t.Fatal(err)
		}
	}
	count := func(kind protocol.EventKind) int {
		evs, err := events.List(ctx, js, kind, 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(evs)
	}
	if n := count(protocol.EventAgentFailed); n != 1 {
		t.Errorf("agent_failed stored %d times, want once", n)
	}
	if n := count(protocol.EventStepRecovered); n != 2 {
		t.Errorf("step_recovered stored %d times, want once per epoch (2)", n)
	}
	if n := count(protocol.EventFailover); n != 1 {
		t.Errorf("failover stored %d times, want once", n)
	}
}

func TestMsgIDIgnoresTimeAndDataOrder(t *testing.T) {
	t.Parallel()
	a := protocol.Event{Kind: protocol.EventHealing, ID: "a", Data: map[string]string{"x": "1", "y": "2"}, Time: time.Unix(1, 0)}
	b := protocol.Event{Kind: protocol.EventHealing, ID: "a", Data: map[string]string{"y": "2", "x": "1"}, Time: time.Unix(9, 0)}
	c := protocol.Event{Kind: protocol.EventHealing, ID: "a", Data: map[string]string{"x": "1", "y": "3"}}
	if events.MsgID(a) != events.MsgID(b) {
		t.Errorf("same event, different ids: %s %s", events.MsgID(a), events.MsgID(b))
	}
	if events.MsgID(a) == events.MsgID(c) {
		t.Errorf("different events, same id %s", events.MsgID(a))
	}
	if odd := (protocol.Event{Kind: protocol.EventResultRejected, ID: "not a token"}); events.MsgID(odd)[:len("result_rejected._.")] != "result_rejected._." {
		t.Errorf("id of an event about no valid token: %s", events.MsgID(odd))
	}
}
