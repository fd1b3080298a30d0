package jobstore

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/wardenhq/warden/pkg/protocol"
)

// fill sets every settable field reachable from v to a value that is not
// its zero and differs from every other field's (n counts them), so that a
// field the encoder leaves out, or writes under another field's key, shows
// in the output. Strings are str with the count appended, times at plus
// the count in seconds, byte slices (json.RawMessage) a small object.
func fill(t *testing.T, v reflect.Value, str string, at time.Time, n *int) {
	t.Helper()
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("%s%d", str, *n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(90_000_000_000 + int64(*n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), str, at, n)
	case reflect.Interface:
		v.Set(reflect.ValueOf(fmt.Sprintf("%s%d", str, *n)))
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			v.SetBytes(fmt.Appendf(nil, `{"k":[%d,"v",null,{"n":true}]}`, *n))
			return
		}
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := 0; i < 2; i++ {
			fill(t, v.Index(i), str, at, n)
		}
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k, str, at, n)
		fill(t, e, str, at, n)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			v.Set(reflect.ValueOf(at.Add(time.Duration(*n) * time.Second)))
			return
		}
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fill(t, v.Field(i), str, at, n)
			}
		}
	default:
		t.Fatalf("fill: no value for %s", v.Type())
	}
}

func TestRecordEncodingMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	utc := time.Date(2026, 11, 26, 19, 42, 34, 682676364, time.UTC)
	zone := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("X", 5*3600+30*60))
	jobs := map[string]*Job{
		"empty": {},
		"single step": {ID: "j1", Name: "n", State: JobRunning, Desired: JobSucceeded, CreatedAt: utc, UpdatedAt: utc, Inline: true,
			Steps: []*Step{{JobID: "j1", ID: "s", Action: "noop", Params: json.RawMessage(`{"message":"hi"}`), Pool: "default",
				State: StepDispatched, Desired: StepSucceeded, Epoch: 1, Attempt: 1, Actor: "a", Token: "t", LockedUntil: utc,
				Attempts: []Attempt{{Epoch: 1, Agent: "a", StartedAt: utc, Status: "dispatched"}}, CreatedAt: utc, UpdatedAt: utc}}},
		"nil step": {ID: "j2", Steps: []*Step{nil}},
	}
	for name, s := range map[string]string{
		"every field":        "plain-value_1.2:3",
		"escapes":            "quote \" backslash \\ newline \n tab \t nul \x00",
		"html":               "<b>a & b</b>",
		"unicode":            "héllo — 日本 \u2028 \u2029",
		"invalid utf-8":      "bad \xff\xfe byte",
		"every field, zoned": "z",
	} {
		at := utc
		if name == "every field, zoned" {
			at = zone
		}
		j := &Job{}
		var n int
		fill(t, reflect.ValueOf(j).Elem(), s, at, &n)
		jobs[name] = j
	}
	for name, j := range jobs {
		want, err := json.Marshal(j)
		if err != nil {
			t.Fatalf("%s: json.Marshal: %v", name, err)
		}
		if got := appendJob(nil, j); string(got) != string(want) {
			t.Errorf("%s: appendJob differs from json.Marshal:\n got %s\nwant %s", name, got, want)
		}
		for i, st := range j.Steps {
			if st == nil {
				continue
			}
			want, _ := json.Marshal(st)
			if got := appendStep(nil, st); string(got) != string(want) {
				t.Errorf("%s: appendStep of step %d differs from json.Marshal:\n got %s\nwant %s", name, i, got, want)
			}
		}
	}
}

// A step that fails again and again with long errors (an agent's error may
// be as long as its max_result_bytes, and '<' is six bytes encoded) keeps a
// record that fits a message: its result could not be written otherwise,
// and was redelivered forever.
func TestAStepFailingWithLongErrorsStaysWritable(t *testing.T) {
	t.Parallel()
	st := &Step{JobID: "j", ID: "s", State: StepPending, Desired: StepSucceeded, MaxRetries: 1000, Timeout: protocol.Duration(time.Minute)}
	now := time.Now().UTC()
	long := strings.Repeat("<", 8192) + "é"
	for i := range 200 {
		if err := st.Dispatch("a1", "", now, time.Second); err != nil {
			t.Fatalf("dispatch %d: %v", i, err)
		}
		if _, err := st.ApplyResult(protocol.Result{Epoch: st.Epoch, Agent: "a1", Status: protocol.ResultFailed, Error: long}, true, now); err != nil {
			t.Fatalf("result %d: %v", i, err)
		}
	}
	b := appendStep(nil, st)
	if len(b) > 1<<20-64<<10 {
		t.Fatalf("the record is %d bytes after 200 failures, over the payload limit's margin", len(b))
	}
	if len(st.Attempts) != MaxAttempts || st.Attempts[len(st.Attempts)-1].Epoch != st.Epoch {
		t.Fatalf("%d attempts kept, the last at epoch %d (step at %d)", len(st.Attempts), st.Attempts[len(st.Attempts)-1].Epoch, st.Epoch)
	}
	if !utf8.ValidString(st.LastError) || !strings.Contains(st.LastError, "bytes cut") {
		t.Fatalf("last_error not clipped clean: %q...", st.LastError[:40])
	}
	t.Logf("record: %d bytes after 200 failures with 8 KiB errors", len(b))
}
