package config

import (
	"fmt"
	"os"
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"
)

// ShippedDiff says how the config file at path falls short of what a
// shipped file under configs/ promises, every setting written out with
// its default: the yaml keys it leaves out (nested mappings too), and each
// top-level field whose value is not want's ("[]" or "{}" in the file and
// an unset default are the same). The file is loaded into zero, a pointer
// to a zero value of want's type, so a key it leaves out is not filled
// from the defaults. "" when the file names every setting with its
// default. Tests of each process's shipped file call it.
func ShippedDiff(path string, zero, want any) string {
	if err := Load(path, zero); err != nil {
		return err.Error()
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var keys map[string]any
	if err := yaml.Unmarshal(raw, &keys); err != nil {
		return err.Error()
	}
	gv, wv := reflect.ValueOf(zero).Elem(), reflect.ValueOf(want)
	var diffs []string
	missingKeys(gv.Type(), keys, "", &diffs)
	for i := range gv.NumField() {
		g, w := normalizeEmpty(gv.Field(i)).Interface(), normalizeEmpty(wv.Field(i)).Interface()
		if !reflect.DeepEqual(g, w) {
			diffs = append(diffs, fmt.Sprintf("%s = %+v, want %+v", gv.Type().Field(i).Name, g, w))
		}
	}
	return strings.Join(diffs, "; ")
}

// missingKeys appends, for each yaml key of struct type typ not in m, that
// it is missing; nested structs are checked against their own mappings.
func missingKeys(typ reflect.Type, m map[string]any, prefix string, diffs *[]string) {
	for i := range typ.NumField() {
		f := typ.Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if key == "" || key == "-" {
			continue
		}
		v, ok := m[key]
		if !ok {
			*diffs = append(*diffs, "no key "+prefix+key)
			continue
		}
		if f.Type.Kind() == reflect.Struct {
			sub, _ := v.(map[string]any)
			missingKeys(f.Type, sub, prefix+key+".", diffs)
		}
	}
}

// normalizeEmpty returns v with empty slices and maps, at any depth of
// structs, made nil.
func normalizeEmpty(v reflect.Value) reflect.Value {
	switch v.Kind() {
	case reflect.Slice, reflect.Map:
		if v.Len() == 0 {
			return reflect.Zero(v.Type())
		}
	case reflect.Struct:
		out := reflect.New(v.Type()).Elem()
		out.Set(v)
		for i := range v.NumField() {
			if out.Field(i).CanSet() {
				out.Field(i).Set(normalizeEmpty(v.Field(i)))
			}
		}
		return out
	}
	return v
}
