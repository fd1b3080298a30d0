// Package ratelimit owns named rate limits ("at most 50 calls a second to
// the CRM") that steps reference by name and that every scheduler respects
// together.
//
// A limit is N per interval with a burst, enforced per key with GCRA (the
// generic cell rate algorithm, a token bucket kept as one timestamp, the
// theoretical arrival time). The timestamp of each limit and key lives in
// the warden_ratelimits bucket and is changed only by compare-and-set, so
// two schedulers granting at the same time cannot both spend the last
// token: one of them loses the CAS and decides again.
//
// Guarantees: over any window of length t, at most
// Burst + N*t/Interval grants of one limit and key, whichever scheduler
// asked. A refusal says when the next grant is possible, so callers wait
// without polling. Idle records expire with the bucket's TTL (an idle
// limit is full again, which is what its expiry means anyway).
//
// A limit keeps no queue and knows no priorities: whoever asks first once
// a grant is possible takes it. The order of waiting steps is their
// callers' (the scheduler hands out retry times in lines by priority).
//
// A grant whose call never happens (the scheduler's dispatch did not land)
// is given back with Return, so it is offered again rather than lost.
// What is not caught up is time nobody asked: like any token bucket, a
// limit whose callers are all late by more than the burst's worth of
// emission intervals (a process stalled for half a second, starved of
// CPU) loses those grants, so under such stalls the measured rate falls
// below the limit; it never rises above it.
package ratelimit
