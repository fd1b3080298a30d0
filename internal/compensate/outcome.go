package compensate

// CompStatus is a compensation step's state as Outcome sees it.
type CompStatus int

// Statuses of a compensation step.
const (
	// Waiting: not started (its After are not all done) or pending.
	Waiting CompStatus = iota
	// Running: dispatched.
	Running
	// Done: the compensation succeeded.
	Done
	// Failed: the compensation failed for good (its retries are spent, or
	// it was dead-lettered).
	Failed
	// Skipped: it was never run because a compensation it waits for failed.
	Skipped
)

// Outcome folds a plan's compensation states into the job's state:
// StateCompensating while any is waiting or running, StateCompensated when
// all are done, StateCompensationFailed when all are settled and some
// failed. It also returns the compensations to mark skipped now: waiting
// ones that (transitively) wait for a failed one.
func Outcome(plan []Compensation, status map[string]CompStatus) (state string, skip []string) {
	// Propagate failure downstream in plan order: plan order puts a
	// compensation after everything in its After.
	blocked := make(map[string]bool, len(plan))
	for _, c := range plan {
		st := status[c.Of]
		for _, a := range c.After {
			if status[a] == Failed || status[a] == Skipped || blocked[a] {
				if st == Waiting {
					skip = append(skip, c.Of)
					blocked[c.Of] = true
				}
				break
			}
		}
	}
	busy, failed := false, false
	for _, c := range plan {
		st := status[c.Of]
		switch {
		case blocked[c.Of], st == Skipped:
		case st == Failed:
			failed = true
		case st == Waiting, st == Running:
			busy = true
		}
	}
	switch {
	case busy:
		return StateCompensating, skip
	case failed || len(skip) > 0:
		return StateCompensationFailed, skip
	}
	return StateCompensated, skip
}

// Ready lists the compensations that may be dispatched now: waiting ones
// whose After have all succeeded.
func Ready(plan []Compensation, status map[string]CompStatus) []string {
	var out []string
	for _, c := range plan {
		if status[c.Of] != Waiting {
			continue
		}
		ok := true
		for _, a := range c.After {
			if status[a] != Done {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, c.Of)
		}
	}
	return out
}
