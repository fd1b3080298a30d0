package agent

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

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

// A cut result fits its limit whatever its error and output take to
// escape, down to a limit of a few hundred bytes (a server with a tiny
// max_payload), and names the size of the output it cut. The cut was an
// estimate, that escaping at most doubles a string: an error such as an
// HTML page ("<" is six bytes escaped) went over, and its 8 KiB, kept
// whatever the limit, went over any limit below that.
func TestBoundResultFitsWhateverItEscapes(t *testing.T) {
	out, _ := json.Marshal(strings.Repeat(`"<é`, 200<<10))
	for _, limit := range []int{DefaultMaxResultBytes, 16 << 10, 1024, 600} {
		r := protocol.Result{JobID: "j", StepID: "s", Status: protocol.ResultFailed, Output: out,
			Error: "upstream answered " + strings.Repeat("<br>", 5<<10)}
		if !boundResult(&r, limit) {
			t.Fatalf("limit %d: nothing cut", limit)
		}
		b, _ := json.Marshal(r)
		if len(b) > limit {
			t.Fatalf("bounded result is %d bytes, over %d", len(b), limit)
		}
		var o struct {
			Truncated     bool   `json:"truncated"`
			OriginalBytes int    `json:"original_bytes"`
			Head          string `json:"head"`
		}
		if err := json.Unmarshal(r.Output, &o); err != nil || !o.Truncated || o.OriginalBytes != len(out) || !r.Truncated {
			t.Fatalf("limit %d: truncated output %.100s (result truncated=%v): %v; want original_bytes %d", limit, r.Output, r.Truncated, err, len(out))
		}
		if strings.ContainsRune(o.Head, utf8.RuneError) || !strings.HasPrefix(r.Error, "upstream answered") {
			t.Fatalf("limit %d: head %.40q, error %.40q: want runes cut whole, the error's start kept", limit, o.Head, r.Error)
		}
	}
}
