package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// MaxPauseReason is the longest reason a pause takes, in bytes.
const MaxPauseReason = 1024

// CheckPauseReason says whether reason can be a pause's reason (ErrInvalid
// if not).
func CheckPauseReason(reason string) error {
	if len(reason) > MaxPauseReason {
		return fmt.Errorf("%w: the reason of a pause is %d bytes, more than %d", ErrInvalid, len(reason), MaxPauseReason)
	}
	return nil
}

// Pause pauses the schedule name: from now on its ticks submit nothing,
// until Resume. The pause is written in the definition (paused,
// pause_reason, paused_at: the server's time), on the condition that the
// definition read is still the last, so it survives restarts, every
// relay sees it, and a concurrent change is read again rather than
// overwritten. The timer keeps ticking while paused: the relays drop the
// ticks and arm the next, so that a schedule always has a timer, and
// Pause arms the paused revision's as every writer of a definition does.
//
// Writing the definition gives it a new revision, so a tick armed before
// the pause that fires all the same is dropped as one of a replaced
// definition; only a tick whose relaying had already read the definition
// before the pause may still submit its job.
//
// It returns the schedule and whether this call paused it: pausing a
// paused schedule changes nothing, reason and time included. An unknown
// name is ErrNotFound.
func (s *Store) Pause(ctx context.Context, name, reason string) (Entry, bool, error) {
	if err := CheckPauseReason(reason); err != nil {
		return Entry{}, false, err
	}
	now, err := s.serverTime(ctx)
	if err != nil {
		return Entry{}, false, err
	}
	e, changed, err := s.writeDef(ctx, name, func(cur *Definition) (Definition, error) {
		if cur == nil {
			return Definition{}, fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		if cur.Paused {
			return Definition{}, errNoChange
		}
		d := *cur
		d.Paused, d.PauseReason, d.PausedAt = true, reason, now.UTC()
		return d, nil
	})
	if err != nil || !changed {
		return e, changed, err
	}
	// The new revision's timer, as every writer of a definition arms
	// one: it replaces the old revision's, whose tick would be dropped
	// and arm this one anyway, one tick later. Not arming it leaves the
	// schedule paused all the same.
	x, err := e.ValidateStored()
	if err != nil {
		return e, true, nil // a relay drops its ticks and says why
	}
	e.Next, err = s.armNext(ctx, name, e.Rev, x)
	switch {
	case errors.Is(err, errChanged):
		e.Next = time.Time{} // changed again since: the new writer's timer
	case err != nil:
		return e, true, fmt.Errorf("schedule %s paused, its timer not re-armed (its next tick does it): %w", name, err)
	}
	return e, true, nil
}

// Resume resumes the paused schedule name and arms its first tick after
// now (by the server's clock), which it returns in Entry.Next. The ticks
// that fell while it was paused are not caught up, whatever its catchup
// policy: they were skipped, not missed (catchup is about ticks missed
// while no scheduler ran). A writer that dies between the definition and
// its timer leaves the paused definition's timer, whose tick, dropped,
// arms the resumed one: only that first tick is lost.
//
// It returns the schedule and whether this call resumed it: resuming a
// schedule that is not paused changes nothing (Entry.Next is its armed
// timer). An unknown name is ErrNotFound.
func (s *Store) Resume(ctx context.Context, name string) (Entry, bool, error) {
	var x Expr
	e, changed, err := s.writeDef(ctx, name, func(cur *Definition) (Definition, error) {
		if cur == nil {
			return Definition{}, fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		if !cur.Paused {
			return Definition{}, errNoChange
		}
		d := *cur
		d.Paused, d.PauseReason, d.PausedAt = false, "", time.Time{}
		var err error
		x, err = d.ValidateStored()
		return d, err
	})
	if err != nil || !changed {
		return e, changed, err
	}
	next, err := s.armNext(ctx, name, e.Rev, x)
	switch {
	case errors.Is(err, errChanged):
		return e, true, fmt.Errorf("schedule %s was changed or removed while it was being resumed", name)
	case err != nil:
		return e, true, fmt.Errorf("schedule %s resumed, its next tick not armed: %w", name, err)
	}
	e.Next = next
	return e, true, nil
}
