package spec

import (
	"bytes"
	"encoding/json"
)

// checkKeys refuses a JSON spec (b, already decoded: well-formed) that
// names a key twice in one object, anywhere, or, outside the values of
// params, spells a field other than in lower case ASCII (fieldName). encoding/json matches
// field names case-insensitively and keeps the last of duplicates, so
// {"action": "echo", "Action": "shell"} ran shell while anything that read
// the raw JSON (an admission policy, jq, a reviewer) saw echo; YAML
// refuses both. Params are the action's own: any key, in any case, once.
// It allocates only for keys written with escapes (every submission is
// parsed by the scheduler).
func checkKeys(b []byte) error {
	type frame struct {
		obj, free bool   // an object; inside a params value
		start     int    // its first key in keys
		last      []byte // its last key
	}
	var (
		fbuf [16]frame
		kbuf [64][]byte
	)
	stack, keys := fbuf[:0], kbuf[:0] // keys: the open objects' keys so far
	expectKey := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '{', '[':
			free := false
			if n := len(stack); n > 0 {
				top := stack[n-1]
				free = top.free || (top.obj && string(top.last) == "params")
			}
			stack = append(stack, frame{obj: c == '{', free: free, start: len(keys)})
			expectKey = c == '{'
		case '}', ']':
			keys = keys[:stack[len(stack)-1].start]
			stack = stack[:len(stack)-1]
			expectKey = false
		case ',':
			expectKey = len(stack) > 0 && stack[len(stack)-1].obj
		case '"':
			j := i + 1
			escaped := false
			for ; j < len(b) && b[j] != '"'; j++ {
				if b[j] == '\\' {
					escaped = true
					j++
				}
			}
			if expectKey {
				key := b[i+1 : j]
				if escaped {
					var s string
					_ = json.Unmarshal(b[i:j+1], &s)
					key = []byte(s)
				}
				top := &stack[len(stack)-1]
				for _, k := range keys[top.start:] {
					if bytes.Equal(k, key) {
						return invalid(ReasonMalformed, string(key), "key %q appears twice in one object", key)
					}
				}
				if !top.free && !fieldName(key) {
					return invalid(ReasonUnknownField, string(key), "unknown field %q (fields are lower case)", key)
				}
				keys = append(keys, key)
				top.last, expectKey = key, false
			}
			i = j
		}
	}
	return nil
}

// fieldName reports whether key is spelled as every spec field is: lower
// case ASCII letters, digits and '_'. Not only upper case A-Z is refused:
// encoding/json folds Unicode case too, so "ſteps" (long s) was read as
// "steps" and "Key" (Kelvin sign) as "key".
func fieldName(key []byte) bool {
	for _, c := range key {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}
