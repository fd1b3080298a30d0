// Package watch follows the keys of a JetStream key-value bucket (every
// key, or those Config.Keys names) and keeps the view honest across gaps.
// It is the one KV watch loop of the code base: every view built from a
// bucket (presence, cluster members and routing, the API's agent feed,
// the client's snapshots) runs on it rather than on a hand-written loop
// over a KeyWatcher.
//
// nats.go's KV watcher is an ordered consumer that notices a lost consumer
// only after two missed 5 s heartbeats, so after a nats-server restart a
// plain watch is silent for 8–10 s, and a key whose removal left no marker
// while the watch could not see (a purge, an expiry whose marker aged out,
// a bucket without limit markers) is never reported at all. "I could not
// see" then reads as "nothing changed" or "it is gone".
//
// A Watch treats any sign of a gap as one and re-reads the bucket:
//
//   - the connection reports DISCONNECTED or RECONNECTING: the view is
//     stale from that moment; CONNECTED again starts a re-sync at once;
//   - the watch delivered nothing for a heartbeat (1 s by default), the
//     bucket's last sequence on the server (a filtered watch: the last
//     sequence of its keys, one direct get per filter) is beyond the last
//     revision delivered, and the watcher still delivers nothing for the
//     next heartbeat (a put stored just before the probe may be on its
//     way): the watcher stalled (e.g. its consumer died with a cluster
//     node), re-sync; a probe that fails marks the view stale, and the
//     first one that succeeds afterwards re-syncs. A full read covers the
//     stream up to its last sequence when the read began, so a newest
//     message removed before any watcher saw it (an expiry without a
//     marker, a marker that aged out, PurgeDeletes) costs no re-sync;
//   - the watcher's channel closes: re-sync.
//
// A re-sync starts a new watcher, reads every key, and reports only the
// differences from what it reported before: keys that changed or appeared
// (Resync, a put) and keys that disappeared (Resync, KeyValuePurge, no
// entry). Only then is the view fresh again.
//
// Guarantees:
//   - Status().Fresh is false from the moment a gap is detected until the
//     re-sync that follows it has been reported in full.
//   - After a re-sync, every key the handler was told about is either in
//     the bucket with the revision last reported, or reported gone.
//   - Settled(d, now) is true only when the view is fresh and the last gap
//     ended at least d ago: callers that judge absence (the supervisor
//     failing agents over) wait one presence TTL after a gap, so that every
//     live agent has had a heartbeat seen.
//   - Run never returns an error for a transient failure; it retries with
//     Backoff until its context ends.
package watch
