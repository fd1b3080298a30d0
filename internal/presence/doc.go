// Package presence owns agent presence in the warden_presence bucket.
//
// An agent announces itself with Create (so two agents can never hold the
// same id) and keeps its key alive with heartbeats; the bucket's TTL removes
// the key when heartbeats stop, and the limit marker makes that removal
// visible to watchers. A View is a watcher's live picture of the fleet.
package presence
