// Package streams owns the JetStream objects Warden uses. The *.json files
// beside this file are the definitions, in the JSON form the JetStream API and
// `nats stream add --config` accept; the code embeds exactly these files and
// applies them idempotently at start-up. Deployment settings (replicas, shard
// count, TTLs) override a few fields, nothing else.
//
// An existing stream whose configuration cannot be updated to the definition
// (a different retention policy, say) is reported as an *IncompatibleError
// and the process refuses to start rather than run on the wrong semantics.
package streams
