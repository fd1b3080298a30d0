package jobstore

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// fill sets every settable field reachable from v to a value that is not
// its zero, so that a field the encoder leaves out shows in the output.
// Strings are str, and json.RawMessage-like byte slices a small object.
func fill(t *testing.T, v reflect.Value, str string, at time.Time) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		v.SetString(str)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(90_000_000_007)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(9)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), str, at)
	case reflect.Interface:
		v.Set(reflect.ValueOf(str))
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			v.SetBytes([]byte(`{"k":[1,"v",null,{"n":true}]}`))
			return
		}
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := 0; i < 2; i++ {
			fill(t, v.Index(i), str, at)
		}
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k, str, at)
		fill(t, e, str, at)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			v.Set(reflect.ValueOf(at))
			return
		}
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fill(t, v.Field(i), str, at)
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
		fill(t, reflect.ValueOf(j).Elem(), s, at)
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
