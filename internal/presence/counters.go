package presence

// A busy agent's heartbeats differ from one to the next in its counters
// and load (in_flight, succeeded, failed, queue_depth, utilisation,
// health) as well as heartbeat_at; an idle agent's in heartbeat_at alone.
// Decoding each such record in full was a quarter of the supervisor's CPU
// and an eighth of the scheduler's at 5,000 loaded agents
// (docs/performance.md, session 11). refresh reads only those members when
// everything else is byte for byte the record decoded last; anything it is
// not sure of is decoded in full.

import (
	"bytes"
	"strconv"
	"time"

	"github.com/wardenhq/warden/pkg/protocol"
)

// dynamicMember is a Presence member that changes between heartbeats of an
// otherwise stable agent: its JSON name, whether encoding/json may leave
// it out (omitempty), and how to set it from its value (false: not a value
// encoding/json would decode to the same thing).
type dynamicMember struct {
	name     string
	optional bool
	set      func(p *protocol.Presence, v []byte) bool
}

// Each member's setter is written out: helpers that take a field accessor
// read the same but add an indirect call per member to every heartbeat
// every reader applies (7–10 % of refresh, measured).
var dynamicMembers = [...]dynamicMember{
	{"in_flight", false, func(p *protocol.Presence, v []byte) bool {
		n, ok := jsonInt(v)
		p.InFlight = n
		return ok
	}},
	{"succeeded", false, func(p *protocol.Presence, v []byte) bool {
		n, ok := jsonUint(v)
		p.Succeeded = n
		return ok
	}},
	{"failed", false, func(p *protocol.Presence, v []byte) bool {
		n, ok := jsonUint(v)
		p.Failed = n
		return ok
	}},
	{"heartbeat_at", false, func(p *protocol.Presence, v []byte) bool {
		if len(v) < 2 || v[0] != '"' || bytes.IndexByte(v[1:len(v)-1], '\\') >= 0 {
			return false
		}
		var at time.Time
		if at.UnmarshalJSON(v) != nil {
			return false
		}
		p.HeartbeatAt = at
		return true
	}},
	{"queue_depth", true, func(p *protocol.Presence, v []byte) bool {
		n, ok := jsonInt(v)
		p.QueueDepth = n
		return ok
	}},
	{"utilisation", true, func(p *protocol.Presence, v []byte) bool {
		f, ok := jsonFloat(v)
		p.Utilisation = &f
		return ok
	}},
	{"health", true, func(p *protocol.Presence, v []byte) bool {
		f, ok := jsonFloat(v)
		p.Health = &f
		return ok
	}},
}

// numDynamic is len(dynamicMembers), for arrays on the stack.
const numDynamic = len(dynamicMembers)

// refresh returns the record b holds when its shape (its bytes outside
// the dynamic members) is shape0, the shape of the record prev was decoded
// from: prev with the dynamic members read from b (an optional member
// absent from b is zero), and beat when they differ from prev's in
// heartbeat_at alone. ok is false when that is not certain, and the caller
// decodes b in full: a dynamic key written differently, nested or more
// than once, a value that is not a plain JSON number (or, for
// heartbeat_at, a plain string), or another shape. The rest is not
// validated again: it is the bytes that were validated when prev was
// decoded. shape is b's shape appended to buf (nil when b cannot be
// walked), for the caller to keep with the record it decodes.
func refresh(prev protocol.Presence, shape0, b, buf []byte) (p protocol.Presence, beat bool, shape []byte, ok bool) {
	var spans [numDynamic]span
	shape, walked := findDynamic(b, &spans, buf)
	if !walked {
		return protocol.Presence{}, false, nil, false
	}
	if len(shape0) == 0 || !bytes.Equal(shape0, shape) {
		return protocol.Presence{}, false, shape, false
	}
	p = prev
	p.QueueDepth, p.Utilisation, p.Health = 0, nil, nil
	for i, m := range dynamicMembers {
		s := spans[i]
		if s.start < 0 {
			continue
		}
		if !m.set(&p, b[s.value:s.end]) {
			return protocol.Presence{}, false, shape, false
		}
	}
	return p, sameLoad(prev, p), shape, true
}

// sameLoad reports whether a and b agree in every dynamic member but
// heartbeat_at.
func sameLoad(a, b protocol.Presence) bool {
	eq := func(x, y *float64) bool { return x == nil && y == nil || x != nil && y != nil && *x == *y }
	return a.InFlight == b.InFlight && a.Succeeded == b.Succeeded && a.Failed == b.Failed &&
		a.QueueDepth == b.QueueDepth && eq(a.Utilisation, b.Utilisation) && eq(a.Health, b.Health)
}

// span is one dynamic member in a record: start is where its key begins
// (-1: absent), value where its value begins, end where it ends.
type span struct{ start, value, end int }

// findDynamic walks the members of object b once, locates each dynamic one
// (in the order of dynamicMembers) and appends b's shape to shape: b
// without them, each taken out with the comma after it (the last, with the
// comma before it). It is false when a required member is missing, a
// dynamic key occurs twice, or b is not written as encoding/json writes
// (no whitespace between tokens). A top-level key with an escape or a byte outside ASCII is refused, and so is one that
// equals a dynamic key but for case: encoding/json unescapes keys and
// matches them case-insensitively (also under Unicode folding, e.g.
// "ſucceeded"), so such a key would be decoded into a counter too.
func findDynamic(b []byte, out *[numDynamic]span, shape []byte) ([]byte, bool) {
	if len(b) < 2 || b[0] != '{' || b[len(b)-1] != '}' {
		return nil, false
	}
	from := 0 // the start of b's bytes not yet copied to shape
	for d := range out {
		out[d].start = -1
	}
	for i := 1; ; {
		if i >= len(b) || b[i] != '"' {
			return nil, false
		}
		j := i + 1
		for j < len(b) && b[j] != '"' {
			if b[j] == '\\' || b[j] >= 0x80 {
				return nil, false
			}
			j++
		}
		if j+1 >= len(b) || b[j+1] != ':' {
			return nil, false
		}
		key, v := b[i+1:j], j+2
		end := skipValue(b, v)
		if end < 0 || end >= len(b) {
			return nil, false
		}
		d, folded := dynamicIndex(key)
		switch {
		case folded:
			return nil, false
		case d >= 0 && out[d].start >= 0:
			return nil, false
		case d >= 0:
			out[d] = span{start: i, value: v, end: end}
			// Into the shape goes what precedes it; it leaves with the
			// comma after it.
			shape, from = append(shape, b[from:i]...), end
			if b[end] == ',' {
				from++
			}
		}
		if b[end] == '}' {
			if end != len(b)-1 {
				return nil, false
			}
			break
		}
		if b[end] != ',' {
			return nil, false
		}
		i = end + 1
	}
	for d, m := range dynamicMembers {
		if out[d].start < 0 && !m.optional {
			return nil, false
		}
	}
	shape = append(shape, b[from:]...)
	// A last member taken out leaves the comma before it: "…,}" → "…}".
	if n := len(shape); n >= 2 && shape[n-2] == ',' {
		shape = append(shape[:n-2], '}')
	}
	return shape, true
}

// dynamicIndex is the index in dynamicMembers of the member named key
// exactly, or -1; folded is true when key names one in other letter cases.
func dynamicIndex(key []byte) (i int, folded bool) {
	for i, m := range dynamicMembers {
		if len(key) != len(m.name) {
			continue
		}
		if string(key) == m.name {
			return i, false
		}
		if bytes.EqualFold(key, []byte(m.name)) {
			return -1, true
		}
	}
	return -1, false
}

// skipValue is where the JSON value at b[i:] ends, or -1 when b[i:] does
// not start one this walk can skip: a string (escapes skipped), an object
// or array (to its matching close, strings inside skipped), or a number or
// literal (its bytes, up to a ',', '}' or ']').
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = skipString(b, j)
				if j < 0 {
					return -1
				}
				j-- // the loop's j++ moves past the string
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	// A number or literal: its own bytes up to the member's end. Anything
	// else, whitespace above all, is refused: taken for part of a literal,
	// a string written after a space ("k": "a,b") would end the walk at
	// its comma, and the members after it would be read out of step.
	j := i
	for j < len(b) && literalByte(b[j]) {
		j++
	}
	if j == i || j >= len(b) || (b[j] != ',' && b[j] != '}' && b[j] != ']') {
		return -1
	}
	return j
}

// literalByte reports whether c may be part of a JSON number or of true,
// false and null.
func literalByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '+' || c == '.'
}

// skipString is the index after the string that opens at b[i], or -1.
func skipString(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// jsonNumber reports whether v is a JSON number (RFC 8259): strconv also
// takes "+1", "01", ".5" and "1.", which encoding/json refuses.
func jsonNumber(v []byte) bool {
	i := 0
	if i < len(v) && v[i] == '-' {
		i++
	}
	switch {
	case i < len(v) && v[i] == '0':
		i++
	case i < len(v) && v[i] >= '1' && v[i] <= '9':
		for i < len(v) && v[i] >= '0' && v[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(v) && v[i] == '.' {
		i++
		if i >= len(v) || v[i] < '0' || v[i] > '9' {
			return false
		}
		for i < len(v) && v[i] >= '0' && v[i] <= '9' {
			i++
		}
	}
	if i < len(v) && (v[i] == 'e' || v[i] == 'E') {
		i++
		if i < len(v) && (v[i] == '+' || v[i] == '-') {
			i++
		}
		if i >= len(v) || v[i] < '0' || v[i] > '9' {
			return false
		}
		for i < len(v) && v[i] >= '0' && v[i] <= '9' {
			i++
		}
	}
	return i == len(v)
}

func jsonInt(v []byte) (int, bool) {
	if !jsonNumber(v) {
		return 0, false
	}
	n, err := strconv.ParseInt(string(v), 10, strconv.IntSize)
	return int(n), err == nil
}

func jsonUint(v []byte) (uint64, bool) {
	if !jsonNumber(v) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(v), 10, 64)
	return n, err == nil
}

func jsonFloat(v []byte) (float64, bool) {
	if !jsonNumber(v) {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(v), 64)
	return f, err == nil
}
