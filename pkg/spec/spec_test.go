package spec_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/wardenhq/warden/pkg/spec"
)

func TestParseRejects(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, in, reason, mention string
	}{
		{"empty", "   ", spec.ReasonEmpty, "empty"},
		{"no steps", "name: x\nsteps: []\n", spec.ReasonEmpty, "at least one step"},
		{"no name", "steps: [{id: a, action: echo}]", spec.ReasonMissingField, "name"},
		{"malformed yaml", "name: [unclosed", spec.ReasonMalformed, ""},
		{"malformed json", `{"name": "x", "steps": [}`, spec.ReasonMalformed, ""},
		{"unknown field yaml", "name: x\nstepz: []\n", spec.ReasonUnknownField, "stepz"},
		{"unknown step field json", `{"name":"x","steps":[{"id":"a","action":"echo","retries":3}]}`, spec.ReasonUnknownField, "retries"},
		{"duplicate", "name: x\nsteps: [{id: a, action: echo}, {id: a, action: echo}]", spec.ReasonDuplicateStep, `"a"`},
		{"missing dep", "name: x\nsteps: [{id: a, action: echo, depends_on: [zz]}]", spec.ReasonMissingDependency, `"zz"`},
		{"self dep", "name: x\nsteps: [{id: a, action: echo, depends_on: [a]}]", spec.ReasonCycle, "itself"},
		{"cycle", "name: x\nsteps:\n- {id: a, action: echo, depends_on: [c]}\n- {id: b, action: echo, depends_on: [a]}\n- {id: c, action: echo, depends_on: [b]}\n", spec.ReasonCycle, "a -> c -> b -> a"},
		{"bad id", "name: x\nsteps: [{id: 'a.b', action: echo}]", spec.ReasonInvalidID, `"a.b"`},
		{"no action", "name: x\nsteps: [{id: a}]", spec.ReasonMissingField, "action"},
		{"bad retries", "name: x\nsteps: [{id: a, action: echo, max_retries: -1}]", spec.ReasonInvalidValue, "max_retries"},
		{"bad timeout", "name: x\nsteps: [{id: a, action: echo, timeout: soon}]", spec.ReasonMalformed, "soon"},
		{"too large", "name: x\nsteps: [{id: a, action: echo, params: {blob: '" + strings.Repeat("x", 300<<10) + "'}}]", spec.ReasonTooLarge, "limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := spec.Parse([]byte(c.in), spec.Limits{})
			if err == nil {
				t.Fatalf("accepted, want %s", c.reason)
			}
			if !errors.Is(err, spec.ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			if got := spec.ReasonOf(err); got != c.reason {
				t.Fatalf("reason %q, want %q (%v)", got, c.reason, err)
			}
			if !strings.Contains(err.Error(), c.mention) {
				t.Fatalf("error %q does not mention %q", err, c.mention)
			}
		})
	}
}

// TestIdempotencyKeyMustReachTheServerAsWritten: the key is the
// submission's Nats-Msg-Id, whose value NATS clients trim and whose CR and
// LF they turn into spaces, while the job id is derived from the key as
// written. A key the header would change is refused, naming the field.
func TestIdempotencyKeyMustReachTheServerAsWritten(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"k\n", "k ", " k", "\tk", "a\nb", "a\r\nb", "a\tb", "a\x00b", "a\x7fb", "k\u00a0"} {
		body, _ := json.Marshal(map[string]any{"name": "x", "idempotency_key": key, "steps": []any{map[string]string{"id": "a", "action": "echo"}}})
		_, err := spec.Parse(body, spec.Limits{})
		if spec.ReasonOf(err) != spec.ReasonInvalidValue || !strings.Contains(err.Error(), "idempotency_key") {
			t.Errorf("key %q: got %v, want invalid_value naming idempotency_key", key, err)
		}
	}
	// A block scalar keeps its newline: the YAML a person writes by mistake.
	if _, err := spec.Parse([]byte("name: x\nidempotency_key: |\n  release-7\nsteps: [{id: a, action: echo}]\n"), spec.Limits{}); spec.ReasonOf(err) != spec.ReasonInvalidValue {
		t.Errorf("a key from a YAML block scalar (trailing newline): got %v, want invalid_value", err)
	}
	for _, key := range []string{"k", "release 7", "déploiement-42", "a:b/c"} {
		body, _ := json.Marshal(map[string]any{"name": "x", "idempotency_key": key, "steps": []any{map[string]string{"id": "a", "action": "echo"}}})
		if _, err := spec.Parse(body, spec.Limits{}); err != nil {
			t.Errorf("key %q refused: %v", key, err)
		}
	}
}

func TestParseAcceptsDiamondInBothFormats(t *testing.T) {
	t.Parallel()
	yamlSpec := `
name: deploy
idempotency_key: deploy-42
steps:
  - id: build
    action: echo
    params: {msg: hi}
  - id: test
    action: shell
    requires: [linux]
    depends_on: [build]
    timeout: 30s
  - id: scan
    action: echo
    depends_on: [build]
    max_retries: 2
  - id: ship
    action: echo
    pool: deploy
    depends_on: [test, scan]
`
	j, err := spec.Parse([]byte(yamlSpec), spec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(j.Steps) != 4 || j.Steps[1].Timeout.Std().Seconds() != 30 || *j.Steps[2].MaxRetries != 2 {
		t.Fatalf("decoded wrong: %+v", j)
	}
	if j.Steps[0].PoolOrDefault() != spec.DefaultPool || j.Steps[3].PoolOrDefault() != "deploy" {
		t.Fatalf("pools wrong")
	}
	jsonSpec := `{"name":"deploy","steps":[{"id":"a","action":"echo","timeout":"1m"},{"id":"b","action":"echo","depends_on":["a"]}]}`
	j2, err := spec.Parse([]byte(jsonSpec), spec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if j2.Steps[0].Timeout.Std().Minutes() != 1 {
		t.Fatalf("timeout %v", j2.Steps[0].Timeout)
	}
}

func TestMaxStepsLimit(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("name: big\nsteps:\n")
	for i := 0; i < 5; i++ {
		b.WriteString("- {id: s" + string(rune('a'+i)) + ", action: echo}\n")
	}
	_, err := spec.Parse([]byte(b.String()), spec.Limits{MaxSteps: 4})
	if spec.ReasonOf(err) != spec.ReasonTooLarge {
		t.Fatalf("got %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("name: x\nsteps: [{id: a, action: echo}]"))
	f.Add([]byte(`{"name":"x","steps":[{"id":"a","action":"echo","depends_on":["a"]}]}`))
	f.Add([]byte("name: x\nsteps: [{id: a, action: echo, params: {ports: {80: http}}}]"))
	f.Add([]byte("name: x\nsteps: [{id: a, action: echo, params: {v: [.inf, &s abc, *s]}}]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		j, err := spec.Parse(b, spec.Limits{})
		if err != nil {
			if !errors.Is(err, spec.ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		if err := j.Validate(spec.Limits{}); err != nil {
			t.Fatalf("parsed spec fails validation: %v", err)
		}
		// What Parse accepts, the scheduler can store (json.Marshal).
		stored, err := json.Marshal(j)
		if err != nil {
			t.Fatalf("parsed spec does not encode as JSON: %v", err)
		}
		if len(stored) > spec.DefaultLimits.MaxBytes {
			t.Fatalf("parsed spec is %d bytes as JSON, over the limit", len(stored))
		}
	})
}
