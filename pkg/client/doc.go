// Package client is Warden's Go client: what the warden CLI uses and what a
// program embeds to submit jobs and watch them. It speaks only the public
// protocol (package protocol, docs/protocol.md); nothing here is privileged.
//
// Guarantees:
//   - Submit validates the spec locally first: an invalid spec is reported
//     with its reason and nothing is published.
//   - A Submit that returns without error has been durably accepted: the
//     server acknowledged the publish on WARDEN_SUBMIT (PubAck). Whether the
//     scheduler has confirmed it yet is reported separately
//     (Receipt.Confirmed), because the job runs either way.
//   - A resubmission with the same idempotency key returns the same job id.
//   - Follow never polls: it watches the job's keys in the job store and
//     returns as soon as the job record is terminal.
//   - Cancel makes cancelled the job's desired state, which wins: no step of
//     it is dispatched after Cancel returns, and the job never ends
//     succeeded. A job accepted but not made yet (before its run_at or
//     delay, or queued for a scheduler) is cancelled too, and never runs;
//     Job reports such a job from its submission (JobDetail.Held).
//   - A Submit whose publish got no answer (ErrOutcomeUnknown) still names
//     the job it may have stored (Receipt.JobID).
//
// The examples show each scenario end to end on an in-process deployment:
// submit and wait (Example), cancel (ExampleClient_Cancel), a delayed job
// (ExampleClient_Submit_delayed); pkg/agent's show the agent side.
package client
