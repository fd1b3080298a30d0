package schedule_test

import (
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
