package dev

import (
	"bytes"
	"io"
	"sync"
)

// output serialises whole lines from several children onto one writer.
type output struct {
	mu sync.Mutex
	w  io.Writer
}

func (o *output) writeLine(prefix, line []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = o.w.Write(append(append(append([]byte{}, prefix...), line...), '\n'))
}

// prefixWriter prefixes every line a child writes with its name. A partial
// line waits for its end so two children never interleave within a line.
type prefixWriter struct {
	out    *output
	prefix []byte
	buf    []byte
}

func newPrefixWriter(out *output, prefix string) *prefixWriter {
	return &prefixWriter{out: out, prefix: []byte(prefix)}
}

// Write is called by one goroutine at a time (exec copies the child's
// combined output from a single pipe).
func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		p.out.writeLine(p.prefix, bytes.TrimRight(p.buf[:i], "\r"))
		p.buf = p.buf[i+1:]
	}
	// A child that never ends its lines must not grow the buffer forever.
	if len(p.buf) > 64<<10 {
		p.flush()
	}
	return len(b), nil
}

// flush writes what is left of an unterminated line.
func (p *prefixWriter) flush() {
	if len(p.buf) > 0 {
		p.out.writeLine(p.prefix, p.buf)
		p.buf = nil
	}
}
