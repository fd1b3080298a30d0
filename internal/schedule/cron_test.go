package schedule_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/schedule"
)

func TestParseNext(t *testing.T) {
	t.Parallel()
	base := time.Date(2030, 1, 1, 10, 30, 15, 0, time.UTC) // a Tuesday
	cases := []struct{ expr, want string }{
		{"*/5 * * * *", "2030-01-01T10:35:00Z"},
		{"0 * * * *", "2030-01-01T11:00:00Z"},
		{"@hourly", "2030-01-01T11:00:00Z"},
		{"@daily", "2030-01-02T00:00:00Z"},
		{"30 9 * * mon-fri", "2030-01-02T09:30:00Z"},
		{"0 0 1 * *", "2030-02-01T00:00:00Z"},
		{"0 12 * feb *", "2030-02-01T12:00:00Z"},
		{"*/10 * * * * *", "2030-01-01T10:30:20Z"},
		{"0 0 * * 7", "2030-01-06T00:00:00Z"},
		{"0 0 13 * fri", "2030-01-04T00:00:00Z"}, // day 13 or a Friday
		{"15,45 10 * * *", "2030-01-01T10:45:00Z"},
		{"@every 1m", "2030-01-01T10:31:00Z"},
		// A day field starting with * is unrestricted as in Vixie cron,
		// so the other day field alone decides: odd days that are Mondays
		// (2030-01-07, the 7th, is the first), not odd days or Mondays.
		{"0 0 */2 * mon", "2030-01-07T00:00:00Z"},
		{"0 0 1 * */2", "2030-02-01T00:00:00Z"}, // the 1st, whatever its weekday (a Friday)
	}
	for _, c := range cases {
		e, err := schedule.Parse(c.expr, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), nil)
		if err != nil {
			t.Errorf("%s: %v", c.expr, err)
			continue
		}
		if got := e.Next(base).Format(time.RFC3339); got != c.want {
			t.Errorf("%s: next after %s is %s, want %s", c.expr, base.Format(time.RFC3339), got, c.want)
		}
	}
	for _, bad := range []string{"", "* * *", "60 * * * *", "* * * * 8", "5-1 * * * *", "*/0 * * * *", "0 0 30 feb *", "@every 10ms", "@every soon", "@weekday"} {
		if _, err := schedule.Parse(bad, time.Time{}, nil); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Daylight-saving changes west of UTC: time.Date answers a wall time in
// the skipped hour with an earlier instant, and the walk, built on it,
// went backwards and looped for ever ("0 9 * * *" from 9 March 2024 in
// New York) or returned a time not after its input. Every answer is now
// after its input and on the expression, or the instant of a spring
// change that skipped a time of day it names (dst_test.go has the rules).
func TestCronNextAcrossDaylightSavingChanges(t *testing.T) {
	t.Parallel()
	exprs := []struct {
		src string
		on  func(h, m int) bool
	}{
		{"0 9 * * *", func(h, m int) bool { return h == 9 && m == 0 }},
		{"0 3 * * *", func(h, m int) bool { return h == 3 && m == 0 }},
		{"0 2 * * *", func(h, m int) bool { return h == 2 && m == 0 }},
		{"30 1 * * *", func(h, m int) bool { return h == 1 && m == 30 }},
		{"0 0 * * *", func(h, m int) bool { return h == 0 && m == 0 }},
		{"0 * * * *", func(h, m int) bool { return m == 0 }},
		{"*/5 * * * *", func(h, m int) bool { return m%5 == 0 }},
	}
	for _, zone := range []string{"America/New_York", "America/Los_Angeles", "Europe/Berlin", "America/Sao_Paulo", "Australia/Lord_Howe"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			// The package embeds the zone database (the images have none).
			t.Fatalf("no tz data for %s: %v", zone, err)
		}
		for _, x := range exprs {
			done := make(chan string, 1)
			go func() {
				e, err := schedule.Parse(x.src, time.Time{}, loc)
				if err != nil {
					done <- err.Error()
					return
				}
				for _, day := range []time.Time{time.Date(2024, 3, 9, 0, 0, 0, 0, loc), time.Date(2024, 11, 2, 0, 0, 0, 0, loc),
					time.Date(2024, 3, 30, 0, 0, 0, 0, loc), time.Date(2024, 10, 26, 0, 0, 0, 0, loc), time.Date(2024, 4, 6, 0, 0, 0, 0, loc),
					time.Date(2018, 11, 3, 0, 0, 0, 0, loc)} {
					for at := day; at.Before(day.Add(72 * time.Hour)); at = at.Add(7 * time.Minute) {
						n := e.Next(at)
						local := n.In(loc)
						if !n.After(at) || n.Sub(at) > 49*time.Hour || (!x.on(local.Hour(), local.Minute()) && !skippedMatch(n, x.on)) {
							done <- fmt.Sprintf("Next(%s) = %s", at, local)
							return
						}
					}
				}
				done <- ""
			}()
			select {
			case msg := <-done:
				if msg != "" {
					t.Errorf("%s in %s: %s", x.src, zone, msg)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s in %s: Next did not return", x.src, zone)
			}
		}
	}
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skip(err)
	}
	e, err := schedule.Parse("0 * * * *", time.Time{}, ny)
	if err != nil {
		t.Fatal(err)
	}
	if n := e.Next(time.Date(2024, 3, 10, 1, 0, 0, 0, ny)); !n.Equal(time.Date(2024, 3, 10, 3, 0, 0, 0, ny)) {
		t.Errorf("hourly after 01:00 EST on the spring change: %s, want 03:00 EDT", n)
	}
}

// skippedMatch reports whether n is the instant of a change that set the
// clocks forward over a wall time on names.
func skippedMatch(n time.Time, on func(h, m int) bool) bool {
	_, was := n.Add(-time.Nanosecond).Zone()
	_, is := n.Zone()
	shown := time.Date(n.Year(), n.Month(), n.Day(), n.Hour(), n.Minute(), 0, 0, time.UTC)
	for w := shown.Add(-time.Duration(is-was) * time.Second); w.Before(shown); w = w.Add(time.Minute) {
		if on(w.Hour(), w.Minute()) {
			return true
		}
	}
	return false
}
