// Package scheduler turns submissions into jobs, dispatches ready steps to
// agents and consumes their results.
//
// Schedulers are stateless: any number share the durable consumers on
// WARDEN_SUBMIT and WARDEN_RESULTS, and every write to the job store is a
// compare-and-set, so a step is dispatched once per epoch whichever
// scheduler gets there first. A message is acknowledged only when all its
// consequences are durable (job and step records written, ready steps
// dispatched); if any is missing — no agent present yet, a lost connection —
// the message is redelivered and handled again, which is idempotent.
package scheduler
