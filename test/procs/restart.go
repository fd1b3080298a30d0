package procs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// RestartExited restarts, like systemd, each process of ps that exits,
// with start, until the test ends; restarts reports how many it started.
// It polls off the test goroutine, where t.Fatal and t.Cleanup must not be
// called, so it hands start a detachedTB that collects the processes'
// cleanups. Its own cleanup, registered after ps were started so it runs
// before theirs, stops the loop, waits for it to exit, and only then kills
// what it started: nothing is started during or after the cleanup.
func RestartExited(t *testing.T, ps map[string]*Proc, start func(tb testing.TB, id string) *Proc) (restarts func() int) {
	t.Helper()
	ids := make([]string, 0, len(ps))
	for id := range ps {
		ids = append(ids, id)
	}
	d := &detachedTB{TB: t}
	var n atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for _, id := range ids {
				if ps[id].Running() {
					continue
				}
				p, err := d.start(func() *Proc { return start(d, id) })
				if err != nil {
					t.Errorf("restart %s: %v", id, err) // Errorf is safe off the test goroutine
					return
				}
				ps[id] = p
				n.Add(1)
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		d.cleanup()
	})
	return func() int { return int(n.Load()) }
}

// detachedTB stands in for t off the test goroutine: Fatal* abort only
// the call made through start, and Cleanup collects the functions for
// cleanup, run on the test goroutine. Everything else is the test's.
type detachedTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
}

type detachedFatal struct{ msg string }

func (d *detachedTB) Helper()                   {}
func (d *detachedTB) FailNow()                  { panic(detachedFatal{"FailNow"}) }
func (d *detachedTB) Fatal(args ...any)         { panic(detachedFatal{fmt.Sprint(args...)}) }
func (d *detachedTB) Fatalf(f string, a ...any) { panic(detachedFatal{fmt.Sprintf(f, a...)}) }
func (d *detachedTB) Cleanup(f func()) {
	d.mu.Lock()
	d.cleanups = append(d.cleanups, f)
	d.mu.Unlock()
}

func (d *detachedTB) start(f func() *Proc) (p *Proc, err error) {
	defer func() {
		if r := recover(); r != nil {
			fatal, ok := r.(detachedFatal)
			if !ok {
				panic(r)
			}
			err = errors.New(fatal.msg)
		}
	}()
	return f(), nil
}

// cleanup runs the collected cleanups, last first, like t's.
func (d *detachedTB) cleanup() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := len(d.cleanups) - 1; i >= 0; i-- {
		d.cleanups[i]()
	}
}
