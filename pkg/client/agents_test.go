package client_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

func TestAgentsAndWaitForAgents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	kv, err := b.js.KeyValue(ctx(t), protocol.BucketPresence)
	if err != nil {
		t.Fatal(err)
	}
	put := func(pool, id string) {
		p := protocol.Presence{ID: id, Pool: pool, MaxConcurrent: 4, HeartbeatAt: time.Now()}.Routed(4)
		v, _ := json.Marshal(p)
		if _, err := kv.Create(ctx(t), protocol.PresenceKey(pool, id), v); err != nil {
			t.Fatal(err)
		}
	}

	waited := make(chan error, 1)
	go func() { waited <- b.client.WaitForAgents(ctx(t), "default", 2) }()
	put("default", "agent-2")
	put("gpu", "agent-9")
	put("default", "agent-1")
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitForAgents did not return")
	}

	agents, err := b.client.Agents(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(agents) != 3 || agents[0].ID != "agent-1" || agents[2].Pool != "gpu" {
		t.Fatalf("agents %+v", agents)
	}

	short, cancel := context.WithTimeout(ctx(t), 100*time.Millisecond)
	defer cancel()
	if err := b.client.WaitForAgents(short, "default", 3); err == nil {
		t.Fatal("WaitForAgents returned without enough agents")
	}
}
