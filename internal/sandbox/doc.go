// Package sandbox runs a whole Warden inside one process — an embedded NATS
// server with Warden's streams, a scheduler and a supervisor, and SDK agents
// on demand — for the runnable examples of the public packages. It needs no
// testing.T (examples have none); tests use internal/natstest.
//
// Everything runs on the production code paths; only the retry backoff is
// shortened (50 ms) so that an example with a retry finishes at once.
package sandbox
