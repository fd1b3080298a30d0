package schedule

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Expr is a parsed schedule expression: a cron expression or an interval.
type Expr interface {
	// Next is the first tick strictly after t.
	Next(t time.Time) time.Time
	String() string
}

// Parse reads a schedule expression:
//   - five cron fields "min hour day-of-month month day-of-week", or six
//     with seconds first; each field takes *, a value, a range a-b, a step
//     (*/n, a-b/n) and lists; months and weekdays also by name (jan, mon);
//     day-of-week 0 and 7 are Sunday; when both day fields are restricted
//     a day matches either, and a field starting with * (*/2) is not
//     restricted (as in Vixie cron);
//   - @yearly (@annually), @monthly, @weekly, @daily (@midnight), @hourly;
//   - @every <duration> (at least 1s), ticking at anchor + k × duration.
//
// Cron times are in loc (UTC when nil). Where loc's clocks change (daylight
// saving), an expression fires as Vixie cron and cronie run it:
//   - one with * in its minute or hour field (*/15 * * * *, 0 * * * *,
//     @hourly) fires at every instant the clock shows a matching time: in
//     both passes of an hour the clocks repeat, and not at all in an hour
//     they skip;
//   - one at fixed times of day (minute and hour fields without *: 30 1 * *
//     *, 0 2 * * mon, @daily) fires once a day as the clock shows it: only
//     in the first pass of a repeated hour, and at the change itself (3:00
//     in New York's spring) for matching times the change skips.
//
// @every intervals are absolute time and ignore the clocks.
func Parse(s string, anchor time.Time, loc *time.Location) (Expr, error) {
	if loc == nil {
		loc = time.UTC
	}
	s = strings.TrimSpace(s)
	if rest, ok := strings.CutPrefix(s, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		if err != nil {
			return nil, fmt.Errorf("schedule %q: %w", s, err)
		}
		if d < time.Second {
			return nil, fmt.Errorf("schedule %q: an interval must be at least 1s", s)
		}
		return every{d: d, anchor: anchor.Truncate(time.Second)}, nil
	}
	switch s {
	case "@yearly", "@annually":
		s = "0 0 1 1 *"
	case "@monthly":
		s = "0 0 1 * *"
	case "@weekly":
		s = "0 0 * * 0"
	case "@daily", "@midnight":
		s = "0 0 * * *"
	case "@hourly":
		s = "0 * * * *"
	}
	f := strings.Fields(s)
	if len(f) == 5 {
		f = append([]string{"0"}, f...)
	}
	if len(f) != 6 {
		return nil, fmt.Errorf("schedule %q: want 5 cron fields (6 with seconds), @hourly and friends, or @every <duration>", s)
	}
	c := cron{src: s, loc: loc}
	var err error
	specs := []struct {
		dst      *uint64
		name     string
		min, max int
		names    []string
	}{
		{&c.sec, "second", 0, 59, nil},
		{&c.min, "minute", 0, 59, nil},
		{&c.hour, "hour", 0, 23, nil},
		{&c.dom, "day of month", 1, 31, nil},
		{&c.month, "month", 1, 12, months},
		{&c.dow, "day of week", 0, 7, weekdays},
	}
	for i, sp := range specs {
		if *sp.dst, err = field(f[i], sp.min, sp.max, sp.names); err != nil {
			return nil, fmt.Errorf("schedule %q: %s field %q: %w", s, sp.name, f[i], err)
		}
	}
	if c.dow&(1<<7) != 0 {
		c.dow |= 1 // 7 is Sunday too
	}
	// As Vixie cron: a day field starting with * (*/2 too) counts as
	// unrestricted, so "0 0 */2 * mon" is odd days that are Mondays, not
	// odd days or Mondays.
	c.domStar, c.dowStar = unrestricted(f[3]), unrestricted(f[5])
	c.fixed = !unrestricted(f[1]) && !unrestricted(f[2])
	if c.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, loc)).IsZero() {
		return nil, fmt.Errorf("schedule %q never fires", s)
	}
	return c, nil
}

// unrestricted reports whether a day field leaves the other to decide.
func unrestricted(field string) bool { return strings.HasPrefix(field, "*") || field == "?" }

var (
	months   = []string{"", "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}
	weekdays = []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}
)

// field parses one cron field into a bit set.
func field(s string, lo, hi int, names []string) (uint64, error) {
	var bits uint64
	for part := range strings.SplitSeq(s, ",") {
		rng, stepStr, hasStep := strings.Cut(part, "/")
		step := 1
		if hasStep {
			n, err := strconv.Atoi(stepStr)
			if err != nil || n < 1 {
				return 0, fmt.Errorf("bad step %q", stepStr)
			}
			step = n
		}
		a, b := lo, hi
		switch {
		case rng == "*" || rng == "?":
		default:
			as, bs, isRange := strings.Cut(rng, "-")
			var err error
			if a, err = value(as, lo, hi, names); err != nil {
				return 0, err
			}
			b = a
			if isRange {
				if b, err = value(bs, lo, hi, names); err != nil {
					return 0, err
				}
				if b < a {
					return 0, fmt.Errorf("range %q ends before it starts", rng)
				}
			} else if hasStep {
				b = hi
			}
		}
		for v := a; v <= b; v += step {
			bits |= 1 << uint(v)
		}
	}
	return bits, nil
}

func value(s string, lo, hi int, names []string) (int, error) {
	for i, n := range names {
		if n != "" && strings.EqualFold(s, n) {
			return i, nil
		}
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	if v < lo || v > hi {
		return 0, fmt.Errorf("%d is outside %d-%d", v, lo, hi)
	}
	return v, nil
}

type cron struct {
	src                             string
	loc                             *time.Location
	sec, min, hour, dom, month, dow uint64
	domStar, dowStar                bool
	// fixed: neither the minute nor the hour field starts with * (Vixie
	// cron's test, seconds aside): times of day, which a clock change
	// neither repeats nor drops (see Parse).
	fixed bool
}

func (c cron) String() string { return c.src }

func (c cron) dayMatches(t time.Time) bool {
	d, w := c.dom&(1<<uint(t.Day())) != 0, c.dow&(1<<uint(t.Weekday())) != 0
	switch {
	case c.domStar && c.dowStar:
		return true
	case c.domStar:
		return w
	case c.dowStar:
		return d
	}
	return d || w
}

// Next is the first tick after the given time: the first instant whose
// wall clock matches (see walk), except that for fixed times of day
// (c.fixed) an instant in the second pass of a repeated stretch is not a
// tick, and the instant of a change that skipped a matching time is (see
// Parse). It gives up after five years, returning the zero time, for
// expressions like Feb 30.
func (c cron) Next(after time.Time) time.Time {
	from := after.In(c.loc).Truncate(time.Second).Add(time.Second)
	limit := from.AddDate(5, 0, 0)
	next := c.walk(from, limit)
	if !c.fixed {
		return next
	}
	for !next.IsZero() {
		end, ok := repeated(next)
		if !ok {
			break
		}
		next = c.walk(end, limit)
	}
	if !next.IsZero() {
		limit = next
	}
	if skip := c.skippedTo(from, limit); !skip.IsZero() {
		return skip
	}
	return next
}

// repeated reports whether the clock showed t's wall time before: t is
// within d after a change that set the clocks back by d. It returns the
// end of that second pass.
func repeated(t time.Time) (time.Time, bool) {
	start, _ := t.ZoneBounds()
	if start.IsZero() {
		return time.Time{}, false
	}
	_, was := start.Add(-time.Nanosecond).Zone()
	_, is := t.Zone()
	back := time.Duration(was-is) * time.Second
	if back <= 0 || !t.Before(start.Add(back)) {
		return time.Time{}, false
	}
	return start.Add(back), true
}

// skippedTo returns the first clock change in [from, limit] that skipped
// a matching wall time (one set forward over it), or the zero time.
func (c cron) skippedTo(from, limit time.Time) time.Time {
	at := from.Add(-time.Nanosecond) // a change at from counts
	for {
		_, change := at.ZoneBounds()
		if change.IsZero() || change.After(limit) {
			return time.Time{}
		}
		_, was := at.Zone()
		_, is := change.Zone()
		if fwd := time.Duration(is-was) * time.Second; fwd > 0 {
			// The wall times [shown-fwd, shown) never appeared: walked
			// as UTC, which has no changes, to see whether one matches.
			shown := wallClock(change)
			utc := c
			utc.loc = time.UTC
			if !utc.walk(shown.Add(-fwd), shown).IsZero() {
				return change
			}
		}
		at = change
	}
}

// wallClock is t's wall time as the same reading in UTC.
func wallClock(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), 0, time.UTC)
}

// walk returns the first instant from t on (t included, before limit)
// whose wall clock in c.loc matches every field, or the zero time. It
// goes forward field by field (the classic approach).
//
// Every step moves t forward in absolute time. Hours and minutes advance
// by adding time, so a daylight-saving change is walked through as the
// clock shows it: the skipped hour has no matches, the repeated one has
// them again (Next decides which are ticks). Days and months go through
// time.Date, which for a wall time inside a skipped hour (midnight, in
// some zones) answers with an earlier instant; that answer is not taken.
// Built with time.Date throughout, the walk went backwards at the spring
// change west of UTC and looped for ever ("0 9 * * *" from 9 March 2024
// in New York), wedging the schedule relay, or returned a time not after
// its input.
func (c cron) walk(t, limit time.Time) time.Time {
	nextHour := func() time.Time {
		n := t.Add(time.Hour - time.Duration(t.Minute())*time.Minute - time.Duration(t.Second())*time.Second)
		// A clock change inside the hour (Chatham's at 02:45, changes at
		// 00:01 in older data) starts a new wall clock: walking on to the
		// hour past it skipped the minutes after it (03:45-03:59).
		if _, end := t.ZoneBounds(); !end.IsZero() && end.After(t) && end.Before(n) {
			n = end
		}
		return n
	}
	forward := func(next time.Time) time.Time {
		if next.After(t) {
			return next
		}
		return nextHour()
	}
	for t.Before(limit) {
		if c.month&(1<<uint(t.Month())) == 0 {
			t = forward(time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, c.loc))
			continue
		}
		if !c.dayMatches(t) {
			t = forward(time.Date(t.Year(), t.Month(), t.Day()+1, 0, 0, 0, 0, c.loc))
			continue
		}
		if c.hour&(1<<uint(t.Hour())) == 0 {
			t = nextHour()
			continue
		}
		if c.min&(1<<uint(t.Minute())) == 0 {
			t = t.Add(time.Minute - time.Duration(t.Second())*time.Second)
			continue
		}
		if c.sec&(1<<uint(t.Second())) == 0 {
			t = t.Add(time.Second)
			continue
		}
		return t
	}
	return time.Time{}
}

type every struct {
	d      time.Duration
	anchor time.Time
}

func (e every) String() string { return "@every " + e.d.String() }

func (e every) Next(after time.Time) time.Time {
	if after.Before(e.anchor) {
		return e.anchor
	}
	k := after.Sub(e.anchor)/e.d + 1
	return e.anchor.Add(k * e.d)
}
