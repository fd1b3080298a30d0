package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/schedule"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
)

func (a *app) scheduleCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "schedule", Short: "Recurring jobs: add, list, pause, resume, trigger and remove schedules"}
	var (
		file, cron, every, catchup, tz string
		grace                          time.Duration
		replace                        bool
	)
	add := &cobra.Command{
		Use:   "add NAME (--cron EXPR | --every DURATION) -f SPEC",
		Short: "Submit SPEC as job NAME-<unix time> at every tick",
		Long: `Add a recurring job. Every tick submits the spec as a job named
<NAME>-<unix seconds of the tick>, once, whatever the number of schedulers.

--cron takes 5 fields (minute hour day-of-month month day-of-week), 6 with
seconds first, or @hourly, @daily, @weekly, @monthly, @yearly.
--every takes a duration of at least 1s.

Ticks missed while no scheduler runs collapse into one overdue tick:
--catchup run_once (default) runs it, --catchup skip drops it. A tick is
overdue when handled more than --grace after it was due (default: the
shorter of 1m and the interval).`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (cron == "") == (every == "") {
				return usageError("give exactly one of --cron and --every")
			}
			expr := cron
			if every != "" {
				expr = "@every " + every
			}
			// As submit: stdin only when piped (or -f -), so that a bare
			// command at a terminal says what is missing instead of waiting.
			body, err := a.readSpec(file)
			if err != nil {
				return err
			}
			d := schedule.Definition{Name: args[0], Schedule: expr, TimeZone: tz, Catchup: catchup,
				Grace: protocol.Duration(grace), Spec: string(body)}
			// Checked before connecting: a bad expression or spec is invalid
			// input (2) even with the server down, not "unavailable" (4).
			// It is said as it is, as submit says an invalid spec: the
			// command was called right, and --help has nothing to add to
			// "must not set idempotency_key".
			if _, err := d.Validate(); err != nil {
				return invalidSchedule(err)
			}
			return a.withSchedules(cmd.Context(), func(ctx context.Context, st *schedule.Store) error {
				next, err := st.Add(ctx, d, replace)
				if errors.Is(err, schedule.ErrExists) {
					return &exitError{code: exitUsage, err: err}
				}
				if err := scheduleError(err); err != nil {
					return err
				}
				// A replaced schedule keeps its pause: say so, or the
				// next tick printed would read as a promise.
				var paused *schedule.Entry
				if replace {
					if e, err := st.Get(ctx, d.Name); err == nil && e.Paused {
						paused = &e
					}
				}
				if a.json {
					out := map[string]any{"name": d.Name, "next": next}
					if paused != nil {
						out["paused"] = true
					}
					return writeJSON(a.stdout, out)
				}
				fmt.Fprintf(a.stdout, "schedule %s added; next tick %s (%s)\n", d.Name, tickTime(next, tz), until(next, time.Now()))
				if paused != nil {
					fmt.Fprintf(a.stdout, "it stays paused (%s); `warden schedule resume %s` runs it again\n", pausedText(*paused, time.Now()), d.Name)
				}
				return nil
			})
		},
	}
	f := add.Flags()
	f.StringVarP(&file, "file", "f", "", "job spec file (YAML or JSON); - or none reads stdin when piped")
	f.StringVar(&cron, "cron", "", "cron expression")
	f.StringVar(&every, "every", "", "interval, e.g. 30s or 1h")
	f.StringVar(&catchup, "catchup", schedule.CatchupRunOnce, "overdue tick after downtime: run_once or skip")
	f.DurationVar(&grace, "grace", 0, "how late a tick may run and still count as on time (0: min(1m, interval))")
	f.StringVar(&tz, "tz", "", "time zone of the cron expression (IANA name; default UTC)")
	f.BoolVar(&replace, "replace", false, "replace a schedule of the same name")

	ls := &cobra.Command{
		Use: "ls", Short: "List schedules with their next and last tick", Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withSchedules(cmd.Context(), func(ctx context.Context, st *schedule.Store) error {
				list, err := st.List(ctx)
				// Definitions that are not (written by hand, another
				// version): the others are listed, then the error names
				// them (exit 4, as for code internal).
				var bad error
				if errors.Is(err, schedule.ErrUndecodable) {
					bad, err = &exitError{code: exitUnavailable, err: err}, nil
				}
				if err != nil {
					return &exitError{code: exitUnavailable, err: err}
				}
				if a.json {
					if list == nil {
						list = []schedule.Entry{}
					}
					if err := writeJSON(a.stdout, list); err != nil {
						return err
					}
					return bad
				}
				now := time.Now()
				t := newTable(a.stdout, "NAME", "SCHEDULE", "CATCHUP", "NEXT", "LAST TICK", "CREATED", "PAUSED")
				for _, e := range list {
					next, paused := until(e.Next, now), ""
					if e.Paused {
						next, paused = "paused", oneLine(pausedText(e, now), 80)
					}
					t.row(e.Name, e.Schedule, e.Catchup, next, until(e.LastTick, now), age(e.CreatedAt, now), paused)
				}
				if err := t.flush(); err != nil {
					return err
				}
				return bad
			})
		},
	}
	rm := &cobra.Command{
		Use: "rm NAME", Short: "Remove a schedule (jobs it already submitted are not touched)", Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withSchedules(cmd.Context(), func(ctx context.Context, st *schedule.Store) error {
				if err := scheduleError(st.Remove(ctx, args[0])); err != nil {
					return err
				}
				if !a.json {
					fmt.Fprintf(a.stdout, "schedule %s removed\n", args[0])
					return nil
				}
				return writeJSON(a.stdout, map[string]string{"removed": args[0]})
			})
		},
	}
	cmd.AddCommand(add, ls, rm, a.schedulePauseCommand(), a.scheduleResumeCommand(), a.scheduleTriggerCommand())
	return cmd
}

func (a *app) schedulePauseCommand() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "pause NAME [--reason TEXT]",
		Short: "Pause a schedule: its ticks submit nothing until resume",
		Long: `Pause a schedule. Its ticks submit nothing until ` + "`warden schedule resume`" + `;
they are skipped, not caught up on resume (whatever --catchup says). The
pause is stored with the schedule: every scheduler sees it, across
restarts, and ` + "`ls`" + ` shows it with its reason and since when. Pausing a
paused schedule changes nothing. ` + "`trigger`" + ` still runs a paused schedule.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := schedule.CheckPauseReason(reason); err != nil {
				return invalidSchedule(err)
			}
			return a.withSchedules(cmd.Context(), func(ctx context.Context, st *schedule.Store) error {
				e, changed, err := st.Pause(ctx, args[0], reason)
				if err := scheduleError(err); err != nil {
					return err
				}
				if a.json {
					return writeJSON(a.stdout, map[string]any{"name": e.Name, "paused": true,
						"paused_at": e.PausedAt, "pause_reason": e.PauseReason, "changed": changed})
				}
				if !changed {
					fmt.Fprintf(a.stdout, "schedule %s was already paused %s\n", e.Name, pausedText(e, time.Now()))
					return nil
				}
				fmt.Fprintf(a.stdout, "schedule %s paused; `warden schedule resume %s` runs it again\n", e.Name, e.Name)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, shown by `schedule ls`")
	return cmd
}

func (a *app) scheduleResumeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "resume NAME",
		Short: "Resume a paused schedule from its next tick",
		Long: `Resume a paused schedule. Its first job is the first tick after now;
the ticks that fell while it was paused are not run. Resuming a schedule
that is not paused changes nothing.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withSchedules(cmd.Context(), func(ctx context.Context, st *schedule.Store) error {
				e, changed, err := st.Resume(ctx, args[0])
				if err := scheduleError(err); err != nil {
					return err
				}
				// Not paused (not changed): e is the schedule as read, its
				// armed timer the next tick.
				if a.json {
					return writeJSON(a.stdout, map[string]any{"name": e.Name, "next": e.Next, "changed": changed})
				}
				what := "resumed"
				if !changed {
					what = "was not paused"
				}
				next := "none armed yet (a scheduler arms it)"
				if !e.Next.IsZero() {
					next = fmt.Sprintf("%s (%s)", tickTime(e.Next, e.TimeZone), until(e.Next, time.Now()))
				}
				fmt.Fprintf(a.stdout, "schedule %s %s; next tick %s\n", e.Name, what, next)
				return nil
			})
		},
	}
}

func (a *app) scheduleTriggerCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "trigger NAME",
		Short: "Submit a schedule's job once, now, outside its cadence",
		Long: `Submit the schedule's job once, now, as job <NAME>-t<unix milliseconds>:
an id no tick takes (a tick's is <NAME>-<unix seconds>). A paused schedule
is triggered too, and stays paused; its next tick is unchanged. The job id
is printed: follow it with ` + "`warden job show`" + `.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withSchedules(cmd.Context(), func(ctx context.Context, st *schedule.Store) error {
				job, err := st.Trigger(ctx, args[0])
				if err := scheduleError(err); err != nil {
					return err
				}
				if a.json {
					return writeJSON(a.stdout, map[string]string{"name": args[0], "job_id": job})
				}
				fmt.Fprintf(a.stdout, "schedule %s triggered: job %s\n", args[0], job)
				return nil
			})
		},
	}
}

// scheduleError maps a schedule store's error to the exit codes: an
// unknown schedule 3, an invalid one 2, anything else 4.
func scheduleError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, schedule.ErrNotFound):
		return &exitError{code: exitNotFound, err: err}
	case errors.Is(err, schedule.ErrInvalid):
		return invalidSchedule(err)
	default:
		return &exitError{code: exitUnavailable, err: err}
	}
}

// pausedText says since when and why e is paused: "5m ago: deploy freeze".
func pausedText(e schedule.Entry, now time.Time) string {
	s := "(time unknown)"
	if !e.PausedAt.IsZero() {
		s = until(e.PausedAt, now)
	}
	if e.PauseReason != "" {
		s += ": " + e.PauseReason
	}
	return s
}

// invalidSchedule is a definition schedule.Validate refused: invalid
// input, exit 2, "invalid_argument" with --json, without the pointer to
// --help that a usage error gets.
func invalidSchedule(err error) error {
	return &exitError{code: exitUsage, err: err}
}

// tickTime renders a tick in RFC 3339 in the schedule's zone (tz, UTC when
// empty): the hour its cron expression names, with the offset that makes
// it one instant wherever it is read.
func tickTime(t time.Time, tz string) string {
	loc := time.UTC
	if tz != "" {
		if l, err := time.LoadLocation(tz); err == nil { // validated before
			loc = l
		}
	}
	return t.In(loc).Format(time.RFC3339)
}

// withSchedules connects and opens the schedules stream. It never creates
// or updates it: `warden setup` and the schedulers do, with the
// deployment's replicas (the CLI's idea of the definition, one replica,
// rewrote a replicated stream, or was refused to admin and readonly).
func (a *app) withSchedules(ctx context.Context, f func(context.Context, *schedule.Store) error) error {
	return a.withClient(ctx, func(ctx context.Context, c *client.Client) error {
		st, err := schedule.NewStore(ctx, c.JetStream())
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return &exitError{code: exitUnavailable, err: fmt.Errorf("%w (a scheduler or `warden setup` creates it)", err)}
		}
		if err != nil {
			return &exitError{code: exitUnavailable, err: err}
		}
		return f(ctx, st)
	})
}
