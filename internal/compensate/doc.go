// Package compensate plans the undoing of a job (seed 002's compensation,
// a saga): when a job fails permanently, or is cancelled with compensation,
// the steps that succeeded and declare `compensate:` are undone in reverse
// dependency order.
//
// The package is pure: Plan takes the job's steps and returns the
// compensation steps with their own dependencies; Outcome folds the
// compensation steps' states into the job's final state. The scheduler runs
// the compensation steps like any other step (fenced by epoch, leased,
// retried, recovered by the supervisor), so this package holds no state and
// does no I/O.
//
// Guarantees of a plan:
//   - only steps that succeeded and declare a compensation get one;
//   - if step B depends on step A (directly or through steps without a
//     compensation, or steps that did not succeed), B's compensation ends
//     before A's starts; unrelated compensations run in parallel;
//   - no plan is made while a forward step's outcome is unknown (it is
//     dispatched): it might still succeed and then need undoing too;
//   - a compensation that fails for good stops the compensations that
//     must come after it (they are skipped: undoing A before B's undo
//     worked could leave things worse); the job ends compensation_failed.
package compensate
