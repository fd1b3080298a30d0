package scheduler

import (
	"cmp"
	"container/heap"
	"time"
)

// A worker's waiting jobs are looked at in three orders, each kept as a
// heap beside the waiting map so that a sweep or a wake touches the jobs it
// acts on, not every waiting one: walking and sorting them all cost 0.5 ms
// a wake with 1,000 waiting in a worker, 7 ms with 10,000 and 227 ms with
// 100,000 (BenchmarkWaitingSweep), every wakeEvery and every sweepEvery,
// inside the worker's loop between every other job's turns.
//
//   - due: by retryAt, every waiter (dueRetries);
//   - extend: by extended, waiters holding messages (dueRetries);
//   - wake: by steps in flight, then since, waiters for an agent or a slot
//     (expandWakes).
//
// Entries are not removed when their waiter changes or goes: setWaiter
// pushes a new entry when a waiter's place in an order moves, stamped with
// a sequence number the waiter keeps, and an entry whose number is not its
// waiter's current one is dropped when it reaches the top. compactOrders
// rebuilds the heaps when stale entries outnumber live ones.

// orderEntry is a waiter's place in one order.
type orderEntry struct {
	job      string
	seq      uint64
	at       time.Time // retryAt, extended or since
	inFlight int       // the wake order's first key
}

// waitOrder is a heap of orderEntry.
type waitOrder struct {
	items []orderEntry
	less  func(a, b *orderEntry) bool
}

func (o *waitOrder) Len() int           { return len(o.items) }
func (o *waitOrder) Less(i, j int) bool { return o.less(&o.items[i], &o.items[j]) }
func (o *waitOrder) Swap(i, j int)      { o.items[i], o.items[j] = o.items[j], o.items[i] }
func (o *waitOrder) Push(x any)         { o.items = append(o.items, x.(orderEntry)) }
func (o *waitOrder) Pop() any {
	last := o.items[len(o.items)-1]
	o.items[len(o.items)-1] = orderEntry{}
	o.items = o.items[:len(o.items)-1]
	return last
}

func (o *waitOrder) push(e orderEntry) { heap.Push(o, e) }
func (o *waitOrder) pop() orderEntry   { return heap.Pop(o).(orderEntry) }

// top is the entry that comes first; the order must not be empty.
func (o *waitOrder) top() *orderEntry { return &o.items[0] }

// keep rebuilds the order with the entries keep accepts.
func (o *waitOrder) keep(keep func(e *orderEntry) bool) {
	live := o.items[:0]
	for i := range o.items {
		if keep(&o.items[i]) {
			live = append(live, o.items[i])
		}
	}
	clear(o.items[len(live):])
	o.items = live
	heap.Init(o)
}

func byAt(a, b *orderEntry) bool { return a.at.Before(b.at) || (a.at.Equal(b.at) && a.seq < b.seq) }

// byWakeOrder puts the job with the fewest steps in flight first, then the
// one waiting longest: when a slot frees, a small job waiting behind a
// large fan-out gets it before the fan-out takes the rest.
func byWakeOrder(a, b *orderEntry) bool {
	return cmp.Or(cmp.Compare(a.inFlight, b.inFlight), a.at.Compare(b.at), cmp.Compare(a.seq, b.seq)) < 0
}

// waitOrders are a worker's three orders of its waiting jobs.
type waitOrders struct {
	due, extend, wake waitOrder
	seq               uint64
}

func newWaitOrders() waitOrders {
	return waitOrders{
		due:    waitOrder{less: byAt},
		extend: waitOrder{less: byAt},
		wake:   waitOrder{less: byWakeOrder},
	}
}

// setWaiter records job as waiting with wt, placing it anew in each order
// whose key changed.
func (w *worker) setWaiter(job string, wt waiter) {
	old, ok := w.waiting[job]
	o := &w.orders
	if !ok || !old.retryAt.Equal(wt.retryAt) {
		o.seq++
		wt.dueSeq = o.seq
		o.due.push(orderEntry{job: job, seq: o.seq, at: wt.retryAt})
	} else {
		wt.dueSeq = old.dueSeq
	}
	holds := len(wt.held) > 0
	if !ok || !old.extended.Equal(wt.extended) || (len(old.held) > 0) != holds {
		o.seq++
		wt.extendSeq = o.seq
		if holds {
			o.extend.push(orderEntry{job: job, seq: o.seq, at: wt.extended})
		}
	} else {
		wt.extendSeq = old.extendSeq
	}
	if !ok || old.gate != wt.gate || old.inFlight != wt.inFlight || !old.since.Equal(wt.since) {
		o.seq++
		wt.wakeSeq = o.seq
		if !wt.gate {
			o.wake.push(orderEntry{job: job, seq: o.seq, at: wt.since, inFlight: wt.inFlight})
		}
	} else {
		wt.wakeSeq = old.wakeSeq
	}
	w.waiting[job] = wt
	w.compactOrders()
}

// dropWaiter forgets job's wait; its entries go stale.
func (w *worker) dropWaiter(job string) { delete(w.waiting, job) }

// compactOrders drops stale entries once they outnumber the live ones, so
// that the heaps stay within a small multiple of the waiting jobs.
func (w *worker) compactOrders() {
	o := &w.orders
	limit := 2*len(w.waiting) + 1024
	if o.due.Len() > limit {
		o.due.keep(func(e *orderEntry) bool { wt, ok := w.waiting[e.job]; return ok && wt.dueSeq == e.seq })
	}
	if o.extend.Len() > limit {
		o.extend.keep(func(e *orderEntry) bool {
			wt, ok := w.waiting[e.job]
			return ok && wt.extendSeq == e.seq && len(wt.held) > 0
		})
	}
	if o.wake.Len() > limit {
		o.wake.keep(func(e *orderEntry) bool { wt, ok := w.waiting[e.job]; return ok && wt.wakeSeq == e.seq && !wt.gate })
	}
}

// firstToWake returns up to n waiting jobs in wake order, leaving them in
// it: a job woken and not placed anew by its turn is woken again.
func (w *worker) firstToWake(n int) []string {
	o := &w.orders.wake
	var taken []orderEntry
	for o.Len() > 0 && len(taken) < n {
		e := o.pop()
		if wt, ok := w.waiting[e.job]; ok && wt.wakeSeq == e.seq && !wt.gate {
			taken = append(taken, e)
		}
	}
	return o.putBack(taken)
}

// putBack pushes taken back into o and returns their jobs in order.
func (o *waitOrder) putBack(taken []orderEntry) []string {
	ids := make([]string, len(taken))
	for i, e := range taken {
		ids[i] = e.job
		o.push(e)
	}
	return ids
}

// dueBy returns up to n waiting jobs whose retryAt is not after now,
// earliest first, leaving them in the order: a job retried and not placed
// anew by its turn is due again at the next sweep, as it was when the
// sweep walked every waiter.
func (w *worker) dueBy(now time.Time, n int) []string {
	o := &w.orders.due
	var taken []orderEntry
	for o.Len() > 0 && len(taken) < n && !o.top().at.After(now) {
		e := o.pop()
		if wt, ok := w.waiting[e.job]; ok && wt.dueSeq == e.seq {
			taken = append(taken, e)
		}
	}
	return o.putBack(taken)
}

// extendHeld extends the ack deadline of the messages held for every
// waiting job whose deadline last started before cutoff.
func (w *worker) extendHeld(now, cutoff time.Time) {
	o := &w.orders.extend
	var due []string
	for o.Len() > 0 && !o.top().at.After(cutoff) {
		e := o.pop()
		if wt, ok := w.waiting[e.job]; ok && wt.extendSeq == e.seq && len(wt.held) > 0 {
			due = append(due, e.job)
		}
	}
	// Placed anew after the walk: with a cutoff at now, an entry placed
	// during it would come straight back to the top.
	for _, id := range due {
		wt := w.waiting[id]
		for _, m := range wt.held {
			_ = m.InProgress()
		}
		wt.extended = now
		w.setWaiter(id, wt)
	}
}
