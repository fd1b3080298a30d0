package agent_test

import (
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
)

// /metrics says what the heartbeat says: an agent drained by an operator
// (or self-healing) is draining, and a lowered limit is the limit in
// force. warden_agent_draining used to report only a shutdown's drain, and
// only the configured max_concurrent was served.
func TestMetricsReportDrainAndLimitInForce(t *testing.T) {
	t.Parallel()
	cfg := testConfig("a1")
	cfg.MaxConcurrent = 4
	b := setup(t, cfg, nil)
	a := b.agent
	if got := metric(t, a, "warden_agent_draining"); got != `warden_agent_draining{agent="a1",pool="p"} 0` {
		t.Errorf("before drain: %q", got)
	}
	if got := metric(t, a, "warden_agent_concurrency_limit"); got != `warden_agent_concurrency_limit{agent="a1",pool="p"} 4` {
		t.Errorf("before limit: %q", got)
	}

	if r := b.control(t, protocol.Control{Op: protocol.ControlLimit, Value: 1}); !r.OK {
		t.Fatalf("limit: %+v", r)
	}
	if r := b.control(t, protocol.Control{Op: protocol.ControlDrain}); !r.OK {
		t.Fatalf("drain: %+v", r)
	}
	natstest.Eventually(t, 5*time.Second, "a heartbeat that says draining with max_concurrent 1", func() bool {
		p, err := b.presence(t)
		return err == nil && p.Draining && p.MaxConcurrent == 1
	})
	if got := metric(t, a, "warden_agent_draining"); got != `warden_agent_draining{agent="a1",pool="p"} 1` {
		t.Errorf("after an operator's drain: %q", got)
	}
	if got := metric(t, a, "warden_agent_concurrency_limit"); got != `warden_agent_concurrency_limit{agent="a1",pool="p"} 1` {
		t.Errorf("after limit 1: %q", got)
	}
	if got := metric(t, a, "warden_agent_max_concurrent"); got != `warden_agent_max_concurrent{agent="a1",pool="p"} 4` {
		t.Errorf("configured max_concurrent: %q", got)
	}

	if r := b.control(t, protocol.Control{Op: protocol.ControlUndrain}); !r.OK {
		t.Fatalf("undrain: %+v", r)
	}
	if got := metric(t, a, "warden_agent_draining"); got != `warden_agent_draining{agent="a1",pool="p"} 0` {
		t.Errorf("after undrain: %q", got)
	}
}
