package spec_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wardenhq/warden/pkg/spec"
)

// checkRejected fails t unless err is a ValidationError with reason whose
// text mentions every one of mention.
func checkRejected(t *testing.T, err error, reason string, mention ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted, want %s", reason)
	}
	if !errors.Is(err, spec.ErrInvalid) {
		t.Fatalf("error %v is not ErrInvalid", err)
	}
	if got := spec.ReasonOf(err); got != reason {
		t.Fatalf("reason %q, want %q (%v)", got, reason, err)
	}
	for _, m := range mention {
		if !strings.Contains(err.Error(), m) {
			t.Fatalf("error %q does not mention %q", err, m)
		}
	}
}

// aliasList is a YAML flow list of n aliases *name.
func aliasList(name string, n int) string {
	return "[" + strings.TrimSuffix(strings.Repeat("*"+name+",", n), ",") + "]"
}

// A YAML spec far below the byte limit can alias a large string thousands
// of times: yaml.v3 decodes that cheaply (the strings share memory), and
// only the scheduler's json.Marshal writes it out in full. Parse bounds the
// size with the aliases expanded, without expanding them.
func TestParseRejectsYAMLAliasBomb(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 100<<10)
	cases := []struct{ name, in string }{
		{"string aliased in params", "name: bomb\nsteps:\n- id: a\n  action: echo\n  params:\n    big: &b '" + big +
			"'\n    copies: " + aliasList("b", 2000) + "\n"},
		{"string aliased in a typed field", "name: bomb\nsteps:\n- id: a\n  action: echo\n  params: {big: &b '" + big +
			"'}\n  requires: " + aliasList("b", 2000) + "\n"},
		// Each level is a list of two aliases of the level below: 40
		// levels of a 1 KiB string stand for 2^40 KiB. Measuring it must
		// not expand it either (one measure per anchor).
		{"nested aliases", func() string {
			var b strings.Builder
			b.WriteString("name: bomb\nsteps:\n- id: a\n  action: echo\n  params:\n    l0: &l0 '" + strings.Repeat("x", 1<<10) + "'\n")
			for i := 1; i <= 40; i++ {
				p := "l" + itoa(i-1)
				b.WriteString("    l" + itoa(i) + ": &l" + itoa(i) + " [*" + p + ", *" + p + "]\n")
			}
			return b.String()
		}()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if len(c.in) >= spec.DefaultLimits.MaxBytes {
				t.Fatalf("the spec is %d bytes: it should pass the raw size check", len(c.in))
			}
			_, err := spec.Parse([]byte(c.in), spec.Limits{})
			checkRejected(t, err, spec.ReasonTooLarge, "aliases", "limit")
		})
	}
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// YAML params whose maps have keys other than strings decode as
// map[interface{}]interface{}, which json.Marshal refuses: Parse writes the
// keys as YAML prints them.
func TestParseNormalisesYAMLParams(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, params, want string
	}{
		{"int keys", `{ports: {80: http, 443: https}}`, `{"ports":{"443":"https","80":"http"}}`},
		{"in a list", `{rules: [{1: a}, {true: b, false: c}]}`, `{"rules":[{"1":"a"},{"false":"c","true":"b"}]}`},
		{"float and time keys", `{m: {1.5: x, 2001-12-14: d}}`, `{"m":{"1.5":"x","2001-12-14T00:00:00Z":"d"}}`},
		{"deeply nested", `{a: {b: [[{-7: {9: z}}]]}}`, `{"a":{"b":[[{"-7":{"9":"z"}}]]}}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			in := "name: x\nsteps:\n- {id: a, action: echo, params: " + c.params +
				", compensate: {action: undo, params: " + c.params + "}}\n"
			j, err := spec.Parse([]byte(in), spec.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range []map[string]any{j.Steps[0].Params, j.Steps[0].Compensate.Params} {
				got, err := json.Marshal(p)
				if err != nil {
					t.Fatalf("params do not encode: %v", err)
				}
				if string(got) != c.want {
					t.Fatalf("params %s, want %s", got, c.want)
				}
			}
			if _, err := json.Marshal(j); err != nil {
				t.Fatalf("the parsed job does not encode: %v", err)
			}
		})
	}
}

// What JSON cannot carry is refused, naming where it is.
func TestParseRejectsParamsJSONCannotCarry(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, step, field, mention string
	}{
		{"nan", `params: {v: .nan}`, "steps[0].params.v", ".nan"},
		{"inf in a list", `params: {v: [1, -.inf]}`, "steps[0].params.v[1]", "-.inf"},
		{"inf under an int key", `params: {m: {80: .inf}}`, "steps[0].params.m.80", ".inf"},
		{"compensation", `compensate: {action: undo, params: {x: .Inf}}`, "steps[0].compensate.params.x", ".inf"},
		{"keys equal as text", `params: {m: {1: a, 1.0: b}}`, "steps[0].params.m", `"1"`},
		{"binary value", `params: {v: !!binary gIE=}`, "steps[0].params.v", "UTF-8"},
		{"binary key", `params: {m: {!!binary gIE=: x, 2: y}}`, "steps[0].params.m", "UTF-8"},
		// yaml.v3 drops a null key of a map with string keys: the entry
		// would be lost without a word.
		{"null key", `params: {~: lost, a: 1}`, "", "null"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			in := "name: x\nsteps:\n- id: a\n  action: echo\n  " + c.step + "\n"
			_, err := spec.Parse([]byte(in), spec.Limits{})
			checkRejected(t, err, spec.ReasonInvalidValue, c.field, c.mention)
		})
	}
}

// JSON escaping makes a spec larger than submitted ('<' becomes \u003c):
// Parse refuses a spec whose JSON encoding, as stored, is over the limit.
func TestParseRejectsSpecTooLargeAsStored(t *testing.T) {
	t.Parallel()
	lt := strings.Repeat("<", 50<<10) // 50 KiB, 300 KiB encoded
	for _, in := range []string{
		`{"name":"x","steps":[{"id":"a","action":"echo","params":{"html":"` + lt + `"}}]}`,
		"name: x\nsteps: [{id: a, action: echo, params: {html: '" + lt + "'}}]\n",
	} {
		_, err := spec.Parse([]byte(in), spec.Limits{})
		checkRejected(t, err, spec.ReasonTooLarge, "encoded as JSON", "limit")
	}
	// A spec of the same size that JSON does not grow is fine.
	plain := strings.Replace(`{"name":"x","steps":[{"id":"a","action":"echo","params":{"text":"`+lt+`"}}]}`, "<", "x", -1)
	if _, err := spec.Parse([]byte(plain), spec.Limits{}); err != nil {
		t.Fatal(err)
	}
}

// The documents of a YAML stream after the first were silently dropped.
func TestParseRejectsMultiDocumentYAML(t *testing.T) {
	t.Parallel()
	one := "name: x\nsteps: [{id: a, action: echo}]\n"
	for name, in := range map[string]string{
		"two specs":            one + "---\n" + strings.Replace(one, "x", "y", 1),
		"empty, then the spec": "---\n---\n" + one,
		"second malformed":     one + "---\nname: [\n",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := spec.Parse([]byte(in), spec.Limits{})
			checkRejected(t, err, spec.ReasonMalformed, "more than one document")
		})
	}
	// A trailing separator or end marker adds no document with content.
	for _, in := range []string{"---\n" + one, one + "---\n", one + "...\n", one + "---\n# done\n"} {
		if _, err := spec.Parse([]byte(in), spec.Limits{}); err != nil {
			t.Errorf("%q: %v", in, err)
		}
	}
}

// Every spec Parse accepts can be stored by the scheduler: json.Marshal
// succeeds, within the limit, and what it writes is itself a spec that
// Parse accepts and encodes the same. The corpus is the repository's
// example specs, the valid specs of this package's tests, and inputs that
// once parsed but could not be stored; Parse may refuse those.
func TestParsedSpecsAreStorable(t *testing.T) {
	t.Parallel()
	valid := map[string][]byte{
		"bench yaml": []byte(yamlSpec),
		"bench json": chainJSON(20),
		"anchors": []byte(`name: shared
steps:
  - {id: a, action: echo, params: &common {region: eu, tries: 3, tags: [x, y]}}
  - {id: b, action: echo, params: *common, depends_on: [a]}
  - {id: c, action: echo, params: {<<: *common, region: us}, depends_on: [a]}
`),
		"int keys": []byte("name: x\nsteps: [{id: a, action: echo, params: {ports: {80: http}}}]"),
	}
	for _, f := range []string{"deploy.yaml", "diamond.json", "limited.yaml", "priority-delayed.yaml", "saga.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "examples", f))
		if err != nil {
			t.Fatal(err)
		}
		valid[f] = b
	}
	corpus := map[string][]byte{
		"nan":        []byte("name: x\nsteps: [{id: a, action: echo, params: {v: .nan}}]"),
		"inf":        []byte("name: x\nsteps: [{id: a, action: echo, params: {v: [.inf]}}]"),
		"bool key":   []byte("name: x\nsteps: [{id: a, action: echo, compensate: {action: e, params: {v: {true: 1}}}}]"),
		"html":       []byte(`{"name":"x","steps":[{"id":"a","action":"echo","params":{"a":"` + strings.Repeat("<>&", 30<<10) + `"}}]}`),
		"alias bomb": []byte("name: x\nsteps: [{id: a, action: echo, params: {a: &a '" + strings.Repeat("y", 10<<10) + "', b: " + aliasList("a", 100) + "}}]"),
	}
	for name, b := range valid {
		corpus[name] = b
	}
	for name, in := range corpus {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			j, err := spec.Parse(in, spec.Limits{})
			if err != nil {
				if _, ok := valid[name]; ok || !errors.Is(err, spec.ErrInvalid) {
					t.Fatal(err)
				}
				return
			}
			stored, err := json.Marshal(j)
			if err != nil {
				t.Fatalf("parsed, but the scheduler cannot store it: %v", err)
			}
			if len(stored) > spec.DefaultLimits.MaxBytes {
				t.Fatalf("parsed, but stored it is %d bytes, over the limit", len(stored))
			}
			again, err := spec.Parse(stored, spec.Limits{})
			if err != nil {
				t.Fatalf("the stored form does not parse: %v", err)
			}
			if b, _ := json.Marshal(again); !bytes.Equal(b, stored) {
				t.Fatalf("the stored form parses to something else:\n%s\n%s", stored, b)
			}
		})
	}
}
