package bench

import (
	"fmt"
	"sync"
	"testing"
)

// runTB lets the bench use test/procs outside `go test`: procs takes a
// testing.TB for its cleanups and failures. Fatalf panics with a fatalError,
// which Run recovers into the phase's error; cleanups run at Close.
type runTB struct {
	testing.TB // nil: only the methods below are called by procs
	name       string
	mu         sync.Mutex
	cleanups   []func()
	failed     bool
	logf       func(format string, args ...any)
}

type fatalError struct{ msg string }

func (e fatalError) Error() string { return e.msg }

func newTB(name string, logf func(string, ...any)) *runTB {
	return &runTB{name: name, logf: logf}
}

func (t *runTB) Helper()      {}
func (t *runTB) Name() string { return t.name }
func (t *runTB) Failed() bool { t.mu.Lock(); defer t.mu.Unlock(); return t.failed }
func (t *runTB) Logf(format string, args ...any) {
	if t.logf != nil {
		msg := fmt.Sprintf(format, args...)
		if len(msg) > 4000 {
			msg = "…" + msg[len(msg)-4000:]
		}
		t.logf("%s", msg)
	}
}
func (t *runTB) Fatalf(format string, args ...any) {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
	panic(fatalError{fmt.Sprintf(format, args...)})
}
func (t *runTB) Cleanup(f func()) {
	t.mu.Lock()
	t.cleanups = append(t.cleanups, f)
	t.mu.Unlock()
}

// Close runs the cleanups, last registered first.
func (t *runTB) Close() {
	t.mu.Lock()
	cs := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}
