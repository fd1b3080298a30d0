package spec_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/wardenhq/warden/pkg/spec"
)

// Bad input a reviewer found accepted. Old code: "accepted …" for each.

// A JSON spec followed by a stray '}' or ']' (and more) was accepted:
// Decoder.More is false before them.
func TestJSONSpecWithTrailingDataIsRefused(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"name":"x","steps":[{"id":"a","action":"echo"}]}}`,
		`{"name":"x","steps":[{"id":"a","action":"echo"}]}]{"x":1}`,
		`{"name":"x","steps":[{"id":"a","action":"echo"}]} {"name":"y"}`,
	} {
		_, err := spec.Parse([]byte(in), spec.Limits{})
		var ve *spec.ValidationError
		if !errors.As(err, &ve) || ve.Reason != spec.ReasonMalformed {
			t.Errorf("accepted trailing data (%v): %s", err, in)
		}
	}
	if _, err := spec.Parse([]byte("{\"name\":\"x\",\"steps\":[{\"id\":\"a\",\"action\":\"echo\"}]}\n  \n"), spec.Limits{}); err != nil {
		t.Errorf("trailing white space refused: %v", err)
	}
}

// A required capability no agent can offer (empty: an agent's are not)
// left the step waiting for ever; a NUL in one could make two sets of
// requirements one slot class.
func TestRequiredCapabilitiesAreChecked(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"name":"x","steps":[{"id":"a","action":"echo","requires":[""]}]}`,
		`{"name":"x","steps":[{"id":"a","action":"echo","requires":["  "]}]}`,
		`{"name":"x","steps":[{"id":"a","action":"echo","requires":["gpu\u0000x"]}]}`,
		`{"name":"x","steps":[{"id":"a","action":"echo","requires":[" gpu"]}]}`,
		`{"name":"x","steps":[{"id":"a","action":"echo","compensate":{"action":"undo","requires":[""]}}]}`,
	} {
		if _, err := spec.Parse([]byte(in), spec.Limits{}); err == nil {
			t.Errorf("accepted %s", in)
		}
	}
	if _, err := spec.Parse([]byte(`{"name":"x","steps":[{"id":"a","action":"echo","requires":["gpu","os:linux"]}]}`), spec.Limits{}); err != nil {
		t.Errorf("good requirements refused: %v", err)
	}
}

// A compensation sent to another pool took the forward step's required
// capabilities there: no agent of that pool matched, and the job stayed
// compensating for ever.
func TestCompensationInAnotherPoolTakesNoneOfTheStepsRequirements(t *testing.T) {
	t.Parallel()
	j, err := spec.Parse([]byte(`{"name":"x","steps":[{"id":"train","action":"fit","pool":"gpu","requires":["cuda"],
		"compensate":{"action":"release","pool":"cpu"}},
		{"id":"b","action":"fit","pool":"gpu","requires":["cuda"],"compensate":{"action":"release"}},
		{"id":"c","action":"fit","pool":"gpu","requires":["cuda"],"compensate":{"action":"release","pool":"cpu","requires":["x86"]}},
		{"id":"d","action":"fit","pool":"gpu","requires":["cuda"],"compensate":{"action":"release","pool":"gpu"}},
		{"id":"e","action":"fit","requires":["cuda"],"compensate":{"action":"release","pool":"default"}}]}`), spec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	// d and e name the step's own pool (a review of the fix: they lost
	// the step's requirements).
	want := [][]string{nil, {"cuda"}, {"x86"}, {"cuda"}, {"cuda"}}
	for i, s := range j.Steps {
		c, _ := s.CompensationStep()
		if len(c.Requires) != len(want[i]) || (len(want[i]) > 0 && c.Requires[0] != want[i][0]) {
			t.Errorf("undo of %s (pool %q) requires %q, want %q", s.ID, c.Pool, c.Requires, want[i])
		}
	}
}

// A bare JSON number in a duration is nanoseconds: "timeout": 60 was a
// 60 ns timeout (the job timed out at once and compensated), while the
// same spec in YAML is refused. Spec durations under 1 ms are refused.
//
// Old code: "accepted {…"timeout":60…}".
func TestSubMillisecondSpecDurationsAreRefused(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"name":"x","timeout":60,"steps":[{"id":"a","action":"echo"}]}`,
		`{"name":"x","steps":[{"id":"a","action":"echo","timeout":30}]}`,
		`{"name":"x","steps":[{"id":"a","action":"echo","retry":{"base_backoff":1}}]}`,
		`{"name":"x","delay":5,"steps":[{"id":"a","action":"echo"}]}`,
		`{"name":"x","steps":[{"id":"a","action":"echo","compensate":{"action":"undo","timeout":10}}]}`,
	} {
		_, err := spec.Parse([]byte(in), spec.Limits{})
		if !errors.Is(err, spec.ErrInvalid) || !strings.Contains(err.Error(), "nanoseconds") {
			t.Errorf("accepted %s (%v)", in, err)
		}
	}
	if _, err := spec.Parse([]byte(`{"name":"x","timeout":"60s","steps":[{"id":"a","action":"echo","timeout":"1ms"}]}`), spec.Limits{}); err != nil {
		t.Errorf("durations of 60s and 1ms refused: %v", err)
	}
}

// A JSON spec that names a key twice, or spells a field in another case,
// ran what its last spelling said (encoding/json matches field names
// case-insensitively and keeps the last duplicate), while anything that
// read the raw JSON saw the first; YAML refuses both. (Found by a
// reviewer.)
//
// Old code: "accepted {…"action":"echo","Action":"shell"…}" (3 cases).
func TestJSONSpecKeysAreExact(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"name":"x","steps":[{"id":"a","action":"echo","Action":"shell"}]}`,
		`{"name":"x","steps":[{"id":"a","action":"echo","action":"shell"}]}`,
		`{"name":"x","steps":[{"id":"a","action":"echo"}],"STEPS":[{"id":"a","action":"shell"}]}`,
		`{"name":"x","steps":[{"id":"a","action":"echo","params":{"cmd":"ls","cmd":"rm"}}]}`,
		`{"name":"x","steps":[{"id":"a","action":"echo","compensate":{"action":"undo","ACTION":"shell"}}]}`,
		`{"name":"x","steps":[{"id":"a","action":"echo","\u0061ction":"shell"}]}`,
		// Unicode case folding (a review of the check): long s, Kelvin sign.
		`{"name":"x","steps":[{"id":"a","action":"echo"}],"ſteps":[{"id":"a","action":"shell"}]}`,
		`{"name":"x","steps":[{"id":"a","action":"echo","concurrency":{"key":"k1","limit":1,"Key":"k2"}}]}`,
	} {
		if _, err := spec.Parse([]byte(in), spec.Limits{}); !errors.Is(err, spec.ErrInvalid) {
			t.Errorf("accepted %s (%v)", in, err)
		}
	}
	// Params are the action's: any case, nested, once each.
	ok := `{"name":"x","steps":[{"id":"a","action":"echo","params":{"Env":{"PATH_X":"1","path_x":"2"},"List":[{"A":1},{"A":2}],"s":"a,\"b\":{"}},
		{"id":"b","action":"echo","depends_on":["a"],"compensate":{"action":"undo","params":{"Mode":"x"}}}]}`
	if _, err := spec.Parse([]byte(ok), spec.Limits{}); err != nil {
		t.Errorf("params with keys in any case refused: %v", err)
	}
}
