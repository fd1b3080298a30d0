package schedule

import (
	"errors"
	"fmt"
	"time"
	// The time zone database in the binary: the images are FROM scratch,
	// with no /usr/share/zoneinfo, and a schedule with a time_zone the CLI
	// accepted on its host was dropped at its first tick in the container
	// ("unknown time zone").
	_ "time/tzdata"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/pkg/spec"
)

// Catch-up policies: what to do with a tick handled later than its grace,
// which means ticks were missed while no scheduler (or no server) ran.
const (
	// CatchupRunOnce runs the overdue tick once; the ticks missed before it
	// collapse into it.
	CatchupRunOnce = "run_once"
	// CatchupSkip drops the overdue tick; the schedule resumes at its next
	// tick.
	CatchupSkip = "skip"
)

// Definition is a recurring job, stored as JSON at warden.schedule.def.<name>.
type Definition struct {
	// Name is the schedule's id; its jobs are <name>-<unix seconds of the tick>.
	Name string `json:"name"`
	// Schedule is a cron expression or "@every <duration>" (see Parse).
	Schedule string `json:"schedule"`
	// TimeZone of the cron expression (an IANA name); empty means UTC.
	TimeZone string `json:"time_zone,omitempty"`
	// Catchup is CatchupRunOnce (the default) or CatchupSkip.
	Catchup string `json:"catchup"`
	// Grace is how late a tick may be handled and still count as on time.
	// Zero means the shorter of one minute and the interval between ticks.
	Grace protocol.Duration `json:"grace,omitempty"`
	// Spec is the job spec (YAML or JSON) submitted at every tick.
	Spec string `json:"spec"`
	// CreatedAt anchors @every schedules.
	CreatedAt time.Time `json:"created_at"`

	// Paused says the schedule submits nothing at its ticks (Store.Pause,
	// Store.Resume). A definition without it, as every version before
	// pausing wrote, is not paused.
	Paused bool `json:"paused,omitempty"`
	// PauseReason is the operator's note given with the pause.
	PauseReason string `json:"pause_reason,omitempty"`
	// PausedAt is when it was paused, by the server's clock.
	PausedAt time.Time `json:"paused_at,omitzero"`
}

// maxNameLen leaves room for "-<unix seconds>" in a 128-byte job id.
const maxNameLen = 100

// ErrInvalid matches every error Validate returns.
var ErrInvalid = errors.New("invalid schedule")

// Validate checks the definition and returns its parsed expression.
func (d *Definition) Validate() (Expr, error) { return d.check(false) }

// ValidateStored is Validate for a definition stored before: its spec is
// not held to input checks added since (spec.Limits.Accepted), so that an
// upgrade does not stop a schedule it had accepted.
func (d *Definition) ValidateStored() (Expr, error) { return d.check(true) }

func (d *Definition) check(stored bool) (Expr, error) {
	e, err := d.validate(stored)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return e, nil
}

func (d *Definition) validate(stored bool) (Expr, error) {
	if !protocol.ValidToken(d.Name) || len(d.Name) > maxNameLen {
		return nil, fmt.Errorf("schedule name %q: up to %d letters, digits, '_' and '-'", d.Name, maxNameLen)
	}
	switch d.Catchup {
	case "":
		d.Catchup = CatchupRunOnce
	case CatchupRunOnce, CatchupSkip:
	default:
		return nil, fmt.Errorf("catchup %q: use %s or %s", d.Catchup, CatchupRunOnce, CatchupSkip)
	}
	if d.Grace < 0 {
		return nil, fmt.Errorf("grace must not be negative")
	}
	loc, err := d.location()
	if err != nil {
		return nil, err
	}
	e, err := Parse(d.Schedule, d.CreatedAt, loc)
	if err != nil {
		return nil, err
	}
	j, err := spec.Parse([]byte(d.Spec), spec.Limits{Accepted: stored})
	if err != nil {
		return nil, err
	}
	if j.IdempotencyKey != "" {
		return nil, fmt.Errorf("the spec of a schedule must not set idempotency_key: every tick is its own job (<name>-<tick>)")
	}
	if j.RunAt != nil || j.Delay > 0 {
		return nil, fmt.Errorf("the spec of a schedule must not set run_at or delay: the schedule says when it runs")
	}
	return e, nil
}

func (d *Definition) location() (*time.Location, error) {
	if d.TimeZone == "" {
		return time.UTC, nil
	}
	loc, err := time.LoadLocation(d.TimeZone)
	if err != nil {
		return nil, fmt.Errorf("time_zone %q: %w", d.TimeZone, err)
	}
	return loc, nil
}

// grace is how late the tick at t may be handled and still be on time.
func (d *Definition) grace(e Expr, t time.Time) time.Duration {
	if d.Grace > 0 {
		return d.Grace.Std()
	}
	return min(time.Minute, e.Next(t).Sub(t))
}

// JobID is the id of the job a tick at t submits.
func JobID(name string, t time.Time) string {
	return fmt.Sprintf("%s-%d", name, t.Unix())
}

// TriggerID is the id of the job a trigger at t submits:
// <name>-t<unix milliseconds>. A tick's id ends in "-" and digits only,
// which this never does, so a trigger cannot take a tick's id, of its own
// schedule or of another (schedule "a-t1" ticks as a-t1-<unix>). It fits
// a job id: a name of maxNameLen leaves 28 bytes, and the milliseconds
// take 13 until the year 2286.
func TriggerID(name string, t time.Time) string {
	return fmt.Sprintf("%s-t%d", name, t.UnixMilli())
}
