package presence_test

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/events"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/internal/presence"
	"github.com/wardenhq/warden/internal/selection"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

func validPresence(pool, id string, shards int) protocol.Presence {
	shard := protocol.Shard(pool, id, shards)
	return protocol.Presence{ID: id, Pool: pool, Actions: []string{"echo"}, MaxConcurrent: 4, Consumer: id,
		TaskStream: protocol.TaskStream(shard), TaskSubject: protocol.TaskSubject(shard, pool, id), HeartbeatAt: time.Now().UTC()}
}

func TestValidatePresence(t *testing.T) {
	t.Parallel()
	const shards = 4
	ok := validPresence("p", "a", shards)
	other := (protocol.Shard("p", "a", shards) + 1) % shards
	cases := []struct {
		name   string
		key    string
		edit   func(*protocol.Presence)
		shards int
		reason string
	}{
		{"valid", "p.a", nil, shards, ""},
		{"valid, shards unknown", "p.a", nil, 0, ""},
		{"consumer not announced", "p.a", func(p *protocol.Presence) { p.Consumer = "" }, shards, ""},
		{"key names another agent", "p.b", nil, shards, protocol.PresenceRejectKey},
		{"key names another pool", "q.a", nil, shards, protocol.PresenceRejectKey},
		{"id not a token", "p.a.b", func(p *protocol.Presence) { p.ID = "a.b" }, shards, protocol.PresenceRejectKey},
		{"results subject", "p.a", func(p *protocol.Presence) { p.TaskSubject = "warden.result.x.y" }, shards, protocol.PresenceRejectTaskSubject},
		{"results subject, shards unknown", "p.a", func(p *protocol.Presence) { p.TaskSubject = "warden.result.x.y" }, 0, protocol.PresenceRejectTaskSubject},
		{"another agent's subject", "p.a", func(p *protocol.Presence) { p.TaskSubject = protocol.TaskSubject(0, "p", "b") }, shards, protocol.PresenceRejectTaskSubject},
		{"wrong shard", "p.a", func(p *protocol.Presence) {
			p.TaskSubject, p.TaskStream = protocol.TaskSubject(other, "p", "a"), protocol.TaskStream(other)
		}, shards, protocol.PresenceRejectTaskSubject},
		{"events stream", "p.a", func(p *protocol.Presence) { p.TaskStream = protocol.StreamEvents }, shards, protocol.PresenceRejectTaskStream},
		{"stream of another shard, shards unknown", "p.a", func(p *protocol.Presence) { p.TaskStream = protocol.TaskStream(other) }, 0, protocol.PresenceRejectTaskStream},
		{"another consumer", "p.a", func(p *protocol.Presence) { p.Consumer = "b" }, shards, protocol.PresenceRejectConsumer},
	}
	for _, c := range cases {
		p := ok
		if c.edit != nil {
			c.edit(&p)
		}
		err := protocol.ValidatePresence(c.key, p, c.shards)
		var pe *protocol.PresenceError
		switch {
		case c.reason == "" && err != nil:
			t.Errorf("%s: rejected: %v", c.name, err)
		case c.reason != "" && (!errors.As(err, &pe) || pe.Reason != c.reason || !errors.Is(err, protocol.ErrPresenceRejected)):
			t.Errorf("%s: %v, want reason %s", c.name, err, c.reason)
		}
	}
}

// TestViewRejectsForgedPresence: records whose key, task subject, task
// stream or consumer are not what their pool and id derive — or that do not
// decode — are not in the view, never reach the selector or OnChange, each
// raise a presence_rejected event with its reason, and one that overwrites a
// valid agent's record leaves the valid record in use.
func TestViewRejectsForgedPresence(t *testing.T) {
	t.Parallel()
	const shards = 4
	srv := natstest.New(t)
	_, js := srv.Connect(t)
	srv.Ensure(t, js, streams.Options{TaskShards: shards})
	ctx := ctxT(t)
	kv, err := js.KeyValue(ctx, protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string, p protocol.Presence) {
		t.Helper()
		b, _ := json.Marshal(p)
		if _, err := kv.Put(ctx, key, b); err != nil {
			t.Fatal(err)
		}
	}
	valid := validPresence("p", "a", shards)
	put("p.a", valid)

	view, err := presence.NewView(ctx, js, zerolog.Nop(), presence.WithTaskShards(shards), presence.WithEvents(events.NewPublisher(js)))
	if err != nil {
		t.Fatal(err)
	}
	sel := selection.New()
	view.Feed(sel)
	var changed []string
	changes := make(chan string, 64)
	view.OnChange(func(c presence.Change) { changes <- c.Key })
	vctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = view.Run(vctx) }()
	defer func() { cancel(); <-done }()
	<-view.Ready()

	forged := func(id string, edit func(*protocol.Presence)) protocol.Presence {
		p := validPresence("p", id, shards)
		edit(&p)
		return p
	}
	other := (protocol.Shard("p", "e", shards) + 1) % shards
	put("p.b", validPresence("p", "c", shards)) // key of b, body of c
	put("p.d", forged("d", func(p *protocol.Presence) { p.TaskSubject = "warden.result.x.y" }))
	put("p.e", forged("e", func(p *protocol.Presence) {
		p.TaskSubject, p.TaskStream = protocol.TaskSubject(other, "p", "e"), protocol.TaskStream(other)
	}))
	put("p.f", forged("f", func(p *protocol.Presence) { p.TaskStream = protocol.StreamEvents }))
	put("p.g", forged("g", func(p *protocol.Presence) { p.Consumer = "a" }))
	if _, err := kv.Put(ctx, "p.h", []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	hijack := valid
	hijack.TaskStream = protocol.StreamResults
	hijack.HeartbeatAt = time.Now().UTC().Add(time.Second)
	put("p.a", hijack)

	natstest.Eventually(t, 5*time.Second, "7 records rejected", func() bool { return view.Rejected() == 7 })
	var evs []protocol.Event
	natstest.Eventually(t, 5*time.Second, "7 presence_rejected events", func() bool {
		evs, _ = events.List(ctx, js, protocol.EventPresenceRejected, 0)
		return len(evs) == 7
	})
	var got []string
	for _, e := range evs {
		got = append(got, e.Data["key"]+":"+e.Data["reason"])
		if e.Reason == "" || !strings.HasPrefix(e.ID, "presence-") {
			t.Errorf("event %+v: want a reason and an id derived from the record", e)
		}
	}
	sort.Strings(got)
	want := "p.a:task_stream_mismatch p.b:key_mismatch p.d:task_subject_mismatch p.e:task_subject_mismatch " +
		"p.f:task_stream_mismatch p.g:consumer_mismatch p.h:undecodable"
	if strings.Join(got, " ") != want {
		t.Errorf("events %v\nwant   %s", got, want)
	}

	agents := view.Agents()
	if len(agents) != 1 || agents[0].ID != "a" || agents[0].TaskStream != valid.TaskStream {
		t.Fatalf("view holds %+v, want only a's valid record", agents)
	}
	for _, id := range []string{"b", "c", "d", "e", "f", "g", "h"} {
		if _, err := sel.Peek(selection.Request{Pool: "p", Action: "echo", Agent: id}); err == nil {
			t.Errorf("forged agent %s is selectable", id)
		}
	}
	if p, err := sel.Peek(selection.Request{Pool: "p", Action: "echo", Agent: "a"}); err != nil || p.TaskStream != valid.TaskStream {
		t.Errorf("a: %+v, %v; want its valid record", p, err)
	}
	for len(changes) > 0 {
		changed = append(changed, <-changes)
	}
	if len(changed) != 0 {
		t.Errorf("rejected records reported as changes: %v", changed)
	}
}
