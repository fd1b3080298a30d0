package selection

import "time"

// SetClock replaces the selector's clock (tests only).
func SetClock(s *Selector, now func() time.Time) { s.now, s.started = now, now() }
