// Package ops holds operators' actions on a running deployment: cancel or
// retry a job, drain, undrain or fail over an agent. They change the job
// store with the same compare-and-set rules as the scheduler, and reach
// running processes through control subjects (request-reply), so the CLI,
// the HTTP API and programs share one implementation.
//
// Invariants: every change goes through jobstore.Store with compare-and-set
// (a conflict is re-read and retried, never overwritten); a cancel is
// client.Cancel (one implementation for CLI, API and programs); a request to
// a process is answered by a protocol.Reply and judged by its code.
package ops
