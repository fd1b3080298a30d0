package spec

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// The scheduler stores an accepted spec as JSON (internal/jobstore, with
// encoding/json), and a step's params a second time in its step record. A
// spec that decodes but cannot be encoded, or encodes far larger than it
// was submitted, would fail there, after the submission was accepted, and
// be redelivered forever. Parse refuses such specs instead; this file holds
// those checks.

// boundedJob decodes a Job from YAML after checking the size of the
// document with its aliases expanded (yamlSizer).
//
// It implements the decoder's older Unmarshaler form, whose argument
// decodes with the decoder itself: the Job is decoded with KnownFields on,
// from the node already parsed. yaml.Node.Decode would lose KnownFields,
// and parsing the bytes a second time would double the cost of a YAML
// spec.
type boundedJob struct {
	j     *Job
	limit int
}

// UnmarshalYAML implements yaml.v3's obsoleteUnmarshaler.
func (b *boundedJob) UnmarshalYAML(decode func(any) error) error {
	var root nodeOf
	if err := decode(&root); err != nil {
		return err
	}
	sz := yamlSizer{limit: b.limit}
	if n, err := sz.size(root.n); err != nil {
		return err
	} else if n > b.limit {
		return invalid(ReasonTooLarge, "", "with its YAML aliases (*name) expanded the spec is over the limit of %d bytes", b.limit)
	}
	return decode(b.j)
}

// nodeOf takes the node it is decoded from, as it is.
type nodeOf struct{ n *yaml.Node }

// UnmarshalYAML implements yaml.Unmarshaler.
func (o *nodeOf) UnmarshalYAML(n *yaml.Node) error {
	o.n = n
	return nil
}

// yamlSizer measures a YAML node as if its aliases were expanded, without
// expanding them. yaml.v3 decodes an alias of a scalar cheaply (the
// decoded strings share memory), so a spec well under the byte limit can
// name a 100 KiB string thousands of times and decode fine, and only the
// scheduler's json.Marshal would write it out: gigabytes. An alias costs
// what its anchored node costs, computed once per anchor (memo), so the
// walk is linear in the document's nodes however the aliases nest.
//
// The measure is each scalar's text plus one byte (a separator): close to
// the JSON encoding, which checkStorable measures exactly once the spec is
// decoded; this walk only has to stop a spec whose expansion is far over
// the limit before it is decoded. Sizes stop growing at limit+1, which
// cannot overflow.
type yamlSizer struct {
	limit int
	memo  map[*yaml.Node]int // anchored nodes: their size, -1 while being measured
}

func (s *yamlSizer) size(n *yaml.Node) (int, *ValidationError) {
	if n == nil {
		return 0, nil
	}
	if n.Kind == yaml.AliasNode {
		return s.size(n.Alias)
	}
	if n.Anchor != "" {
		if v, ok := s.memo[n]; ok {
			// -1: an alias inside its own anchor. The decoder refuses
			// that ("contains itself"); count nothing here.
			return max(v, 0), nil
		}
		if s.memo == nil {
			s.memo = make(map[*yaml.Node]int)
		}
		s.memo[n] = -1
	}
	var total int
	switch n.Kind {
	case yaml.ScalarNode:
		total = min(len(n.Value)+1, s.limit+1)
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content) && total <= s.limit; i += 2 {
			k := n.Content[i]
			if k.Kind == yaml.AliasNode && k.Alias != nil {
				k = k.Alias
			}
			if k.Kind == yaml.ScalarNode && k.Tag == "!!null" {
				// yaml.v3 drops a null key where keys are strings (params,
				// the spec's own fields) without a word: the entry would
				// be lost.
				return 0, invalid(ReasonInvalidValue, "", "line %d: a mapping key is null (%q); quote it if it is meant as a string", k.Line, k.Value)
			}
			for _, c := range n.Content[i : i+2] {
				v, err := s.size(c)
				if err != nil {
					return 0, err
				}
				total = min(total+v, s.limit+1)
			}
		}
	default: // documents and sequences
		for _, c := range n.Content {
			if total > s.limit {
				break
			}
			v, err := s.size(c)
			if err != nil {
				return 0, err
			}
			total = min(total+v, s.limit+1)
		}
	}
	if n.Anchor != "" {
		s.memo[n] = total
	}
	return total, nil
}

// normaliseParams turns the params of a spec decoded from YAML into values
// encoding/json encodes, as the job store needs them: yaml.v3 decodes a
// nested map whose keys are not all strings as map[interface{}]interface{}
// (json.Marshal fails on it), a key such as 80 is written as YAML prints
// it ("80"), and .nan and .inf, which JSON cannot carry, are refused, as is
// text that is not UTF-8 (from !!binary), which json.Marshal would change.
// The steps' params and their compensations' params are the spec's only
// free-form values.
func (j *Job) normaliseParams() error {
	for i := range j.Steps {
		s := &j.Steps[i]
		if err := normaliseMap(s.Params, "steps["+strconv.Itoa(i)+"].params"); err != nil {
			return err
		}
		if c := s.Compensate; c != nil {
			if err := normaliseMap(c.Params, "steps["+strconv.Itoa(i)+"].compensate.params"); err != nil {
				return err
			}
		}
	}
	return nil
}

// normaliseMap normalises m in place (jsonValue).
func normaliseMap(m map[string]any, field string) error {
	if _, bad := jsonValue(m); bad != nil {
		return bad.validationError(field)
	}
	return nil
}

// badValue is a value jsonValue refuses; path locates it, innermost first,
// and is built only on the way out of an error.
type badValue struct {
	path []string
	msg  string
}

func (b *badValue) in(seg string) *badValue {
	b.path = append(b.path, seg)
	return b
}

func (b *badValue) validationError(field string) *ValidationError {
	var f strings.Builder
	f.WriteString(field)
	for i := len(b.path) - 1; i >= 0; i-- {
		f.WriteString(b.path[i])
	}
	return invalid(ReasonInvalidValue, f.String(), "%s", b.msg)
}

// jsonValue returns v, decoded from YAML, as a value json.Marshal encodes
// without loss: maps and lists are rewritten in place, a map with keys
// other than strings is replaced.
func jsonValue(v any) (any, *badValue) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if !utf8.ValidString(k) {
				return nil, &badValue{msg: "a key is not UTF-8 text (!!binary?): JSON cannot carry it"}
			}
			n, bad := jsonValue(e)
			if bad != nil {
				return nil, bad.in("." + k)
			}
			x[k] = n
		}
		return x, nil
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			ks, ok := yamlKeyString(k)
			if !ok {
				return nil, &badValue{msg: fmt.Sprintf("a key of type %T cannot be a JSON object key", k)}
			}
			if !utf8.ValidString(ks) {
				return nil, &badValue{msg: "a key is not UTF-8 text (!!binary?): JSON cannot carry it"}
			}
			if _, dup := out[ks]; dup {
				// e.g. 1 and 1.0: two keys in YAML, one in JSON.
				return nil, &badValue{msg: "two keys are both " + strconv.Quote(ks) + " once written as text (JSON keys are text): rename one"}
			}
			n, bad := jsonValue(e)
			if bad != nil {
				return nil, bad.in("." + ks)
			}
			out[ks] = n
		}
		return out, nil
	case []any:
		for i, e := range x {
			n, bad := jsonValue(e)
			if bad != nil {
				return nil, bad.in("[" + strconv.Itoa(i) + "]")
			}
			x[i] = n
		}
		return x, nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, &badValue{msg: yamlFloat(x) + " is not a number JSON can carry"}
		}
	case string:
		if !utf8.ValidString(x) {
			return nil, &badValue{msg: "the value is not UTF-8 text (!!binary?): JSON cannot carry it"}
		}
	}
	return v, nil
}

// yamlKeyString writes a map key decoded from YAML as YAML prints it
// (yaml.v3's encoder): 80 as "80", true as "true", 1.5 as "1.5".
func yamlKeyString(k any) (string, bool) {
	switch k := k.(type) {
	case string:
		return k, true
	case bool:
		return strconv.FormatBool(k), true
	case int:
		return strconv.Itoa(k), true
	case int64:
		return strconv.FormatInt(k, 10), true
	case uint64:
		return strconv.FormatUint(k, 10), true
	case float64:
		return yamlFloat(k), true
	case nil:
		return "null", true
	case time.Time:
		return k.Format(time.RFC3339Nano), true
	}
	return "", false
}

// yamlFloat writes f as yaml.v3 does.
func yamlFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return ".nan"
	case math.IsInf(f, 1):
		return ".inf"
	case math.IsInf(f, -1):
		return "-.inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// checkStorable encodes the spec as the job store does (json.Marshal) and
// refuses it if that fails or exceeds the byte limit: JSON escaping can
// make a spec much larger than it was submitted ('<' is written \u003c, six
// bytes).
func (j *Job) checkStorable(l Limits) error {
	b, err := json.Marshal(j)
	if err != nil {
		return invalid(ReasonInvalidValue, "", "the spec cannot be stored as JSON: %v", err)
	}
	if len(b) > l.MaxBytes {
		return invalid(ReasonTooLarge, "", "spec is %d bytes encoded as JSON, as the scheduler stores it, the limit is %d", len(b), l.MaxBytes)
	}
	return nil
}
