package agent

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/wardenhq/warden/pkg/protocol"
)

// A result larger than max_result_bytes is cut to fit and says so; a small
// one is left alone.
func TestBoundResultTruncatesOversizedOutput(t *testing.T) {
	big, _ := json.Marshal(map[string]string{"stdout": strings.Repeat("x", 1<<20)})
	r := protocol.Result{JobID: "j", StepID: "s", Status: protocol.ResultSucceeded, Output: big, Error: strings.Repeat("e", 20<<10)}
	if !boundResult(&r, DefaultMaxResultBytes) {
		t.Fatal("a 1 MiB output was not cut")
	}
	b, _ := json.Marshal(r)
	if len(b) > DefaultMaxResultBytes {
		t.Fatalf("bounded result is %d bytes, over %d", len(b), DefaultMaxResultBytes)
	}
	var out struct {
		Truncated     bool   `json:"truncated"`
		OriginalBytes int    `json:"original_bytes"`
		Head          string `json:"head"`
	}
	if err := json.Unmarshal(r.Output, &out); err != nil || !out.Truncated || out.OriginalBytes != len(big) || out.Head == "" || !r.Truncated {
		t.Fatalf("truncated output %+v (result truncated=%v): %v", out, r.Truncated, err)
	}
	small := protocol.Result{Output: json.RawMessage(`{"ok":true}`)}
	if boundResult(&small, DefaultMaxResultBytes) || small.Truncated || string(small.Output) != `{"ok":true}` {
		t.Fatalf("a small result was changed: %+v", small)
	}
}
