package schedule_test

import (
	"strings"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/schedule"
)

// A schedule at a fixed time of day in a zone with daylight saving ran
// twice on the autumn night ("30 1 * * *" in New York at 01:30 EDT and
// again at 01:30 EST) and not at all on the spring one ("30 2 * * *": 2:30
// does not exist). As Vixie cron and cronie, a fixed time runs once in the
// repeated hour (its first pass) and a skipped one runs at the change;
// an expression with * in its minute or hour field fires at every instant
// the clock shows a matching time, in both passes and in neither.
//
// The zones come from the zone database the package embeds (time/tzdata).
func TestCronDaylightSavingFixedTimesRunOnce(t *testing.T) {
	t.Parallel()
	cases := []struct {
		zone, expr string
		from       string // wall time in zone
		want       []string
	}{
		// New York, autumn: 2024-11-03 02:00 EDT goes back to 01:00 EST.
		{"America/New_York", "30 1 * * *", "2024-11-02 12:00",
			[]string{"2024-11-03T01:30:00-04:00", "2024-11-04T01:30:00-05:00"}},
		{"America/New_York", "0 1 * * *", "2024-11-02 12:00",
			[]string{"2024-11-03T01:00:00-04:00", "2024-11-04T01:00:00-05:00"}},
		{"America/New_York", "0 1-2 * * *", "2024-11-02 12:00",
			[]string{"2024-11-03T01:00:00-04:00", "2024-11-03T02:00:00-05:00", "2024-11-04T01:00:00-05:00"}},
		{"America/New_York", "*/10 30 1 * * *", "2024-11-03 01:30", // seconds aside
			[]string{"2024-11-03T01:30:10-04:00", "2024-11-03T01:30:20-04:00", "2024-11-03T01:30:30-04:00",
				"2024-11-03T01:30:40-04:00", "2024-11-03T01:30:50-04:00", "2024-11-04T01:30:00-05:00"}},
		// ... a wildcard in the minute or hour field fires in both passes.
		{"America/New_York", "0 * * * *", "2024-11-02 23:30",
			[]string{"2024-11-03T00:00:00-04:00", "2024-11-03T01:00:00-04:00", "2024-11-03T01:00:00-05:00", "2024-11-03T02:00:00-05:00"}},
		{"America/New_York", "@hourly", "2024-11-03 00:30",
			[]string{"2024-11-03T01:00:00-04:00", "2024-11-03T01:00:00-05:00", "2024-11-03T02:00:00-05:00"}},
		{"America/New_York", "*/30 1 * * *", "2024-11-03 00:30",
			[]string{"2024-11-03T01:00:00-04:00", "2024-11-03T01:30:00-04:00", "2024-11-03T01:00:00-05:00", "2024-11-03T01:30:00-05:00", "2024-11-04T01:00:00-05:00"}},
		// New York, spring: 2024-03-10 02:00 EST goes on to 03:00 EDT.
		{"America/New_York", "30 2 * * *", "2024-03-09 12:00",
			[]string{"2024-03-10T03:00:00-04:00", "2024-03-11T02:30:00-04:00"}},
		{"America/New_York", "0 2 * * sun", "2024-03-09 12:00",
			[]string{"2024-03-10T03:00:00-04:00", "2024-03-17T02:00:00-04:00"}},
		{"America/New_York", "0,30 2,3 * * *", "2024-03-09 12:00", // the skipped times and 3:00 are one tick
			[]string{"2024-03-10T03:00:00-04:00", "2024-03-10T03:30:00-04:00", "2024-03-11T02:00:00-04:00"}},
		{"America/New_York", "0 3 * * *", "2024-03-09 12:00",
			[]string{"2024-03-10T03:00:00-04:00", "2024-03-11T03:00:00-04:00"}},
		{"America/New_York", "30 1 * * *", "2024-03-09 12:00",
			[]string{"2024-03-10T01:30:00-05:00", "2024-03-11T01:30:00-04:00"}},
		// ... a wildcard has no ticks in the skipped hour, and none made up.
		{"America/New_York", "*/30 * * * *", "2024-03-10 00:45",
			[]string{"2024-03-10T01:00:00-05:00", "2024-03-10T01:30:00-05:00", "2024-03-10T03:00:00-04:00", "2024-03-10T03:30:00-04:00"}},
		{"America/New_York", "30 * * * *", "2024-03-10 00:45",
			[]string{"2024-03-10T01:30:00-05:00", "2024-03-10T03:30:00-04:00"}},
		// Berlin changes at 02:00/03:00 local, east of UTC.
		{"Europe/Berlin", "30 2 * * *", "2024-03-30 12:00",
			[]string{"2024-03-31T03:00:00+02:00", "2024-04-01T02:30:00+02:00"}},
		{"Europe/Berlin", "30 2 * * *", "2024-10-26 12:00",
			[]string{"2024-10-27T02:30:00+02:00", "2024-10-28T02:30:00+01:00"}},
		// São Paulo (2018) skipped midnight: @daily ran at the change, 01:00.
		{"America/Sao_Paulo", "@daily", "2018-11-03 12:00",
			[]string{"2018-11-04T01:00:00-02:00", "2018-11-05T00:00:00-02:00"}},
		{"America/Sao_Paulo", "30 23 * * *", "2019-02-16 12:00",
			[]string{"2019-02-16T23:30:00-02:00", "2019-02-17T23:30:00-03:00"}},
		// Lord Howe moves its clocks by 30 minutes.
		{"Australia/Lord_Howe", "45 1 * * *", "2024-04-06 12:00",
			[]string{"2024-04-07T01:45:00+11:00", "2024-04-08T01:45:00+10:30"}},
		{"Australia/Lord_Howe", "15 2 * * *", "2024-10-05 12:00",
			[]string{"2024-10-06T02:30:00+11:00", "2024-10-07T02:15:00+11:00"}},
		// Rules past the zone table's last listed change (its TZ string).
		{"America/New_York", "30 2 * * *", "2037-03-07 12:00",
			[]string{"2037-03-08T03:00:00-04:00", "2037-03-09T02:30:00-04:00"}},
		{"America/New_York", "30 1 * * *", "2037-10-31 12:00",
			[]string{"2037-11-01T01:30:00-04:00", "2037-11-02T01:30:00-05:00"}},
		// No changes: UTC.
		{"UTC", "30 2 * * *", "2024-03-10 00:00", []string{"2024-03-10T02:30:00Z", "2024-03-11T02:30:00Z"}},
	}
	for _, c := range cases {
		loc, err := time.LoadLocation(c.zone)
		if err != nil {
			t.Fatalf("no tz data for %s: %v", c.zone, err)
		}
		e, err := schedule.Parse(c.expr, time.Time{}, loc)
		if err != nil {
			t.Fatalf("%s: %v", c.expr, err)
		}
		at, err := time.ParseInLocation("2006-01-02 15:04", c.from, loc)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for range c.want {
			at = e.Next(at)
			got = append(got, at.In(loc).Format(time.RFC3339))
		}
		if strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("%q in %s from %s:\n got  %v\n want %v", c.expr, c.zone, c.from, got, c.want)
		}
	}
}

// Chatham's clocks go forward at 02:45 (+12:45 to +13:45): the walk went
// from the change to the next hour of the new clock, 04:00, and never saw
// 03:45-03:59, so "50 3 * * *" skipped that day and "*/5 3 * * *" lost a
// quarter of an hour.
func TestCronChangeInsideAnHour(t *testing.T) {
	t.Parallel()
	loc, err := time.LoadLocation("Pacific/Chatham")
	if err != nil {
		t.Fatal(err)
	}
	from := time.Date(2025, 9, 27, 12, 0, 0, 0, loc)
	daily, err := schedule.Parse("50 3 * * *", time.Time{}, loc)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := daily.Next(from), time.Date(2025, 9, 28, 3, 50, 0, 0, loc); !got.Equal(want) {
		t.Errorf("50 3 * * * from %s: %s, want %s", from, got, want)
	}
	every5, err := schedule.Parse("*/5 3 * * *", time.Time{}, loc)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for at := time.Date(2025, 9, 28, 2, 0, 0, 0, loc); len(got) < 3; {
		at = every5.Next(at)
		got = append(got, at.Format("15:04 -0700"))
	}
	if want := "03:45 +1345 03:50 +1345 03:55 +1345"; strings.Join(got, " ") != want {
		t.Errorf("*/5 3 * * * on the change day: %v, want %s", got, want)
	}
}
