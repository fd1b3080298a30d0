// Package cluster owns agent clusters: their definitions in the
// warden_clusters bucket, leadership, shard assignment, health and state
// sync (docs/clusters.md).
//
// Who does what:
//   - Operators write definitions (Store, `warden cluster`).
//   - Member agents do the membership work themselves (Member, run by
//     pkg/agent when its config names a cluster): each writes a report every
//     heartbeat, campaigns for the lease cluster.<name> and, while it holds
//     the lease, is the cluster's leader: it computes the ClusterState
//     (roles, shard owners, epoch, health) with Compute and writes it by
//     compare-and-set, publishes the sync state, handles requests and raises
//     the events. No supervisor is needed for a cluster to fail over.
//   - Dispatch asks a Router (a watch of the states) where a step goes.
//
// Guarantees:
//   - At most one member holds the lease at a time (Create wins, CAS renews,
//     a per-key TTL frees it); a holder that cannot prove a renewal younger
//     than the key lives on the server (the lease duration in whole
//     seconds, at most the leases bucket's max age) considers itself
//     deposed at once, even before its renewal fails (a SIGSTOPped leader
//     wakes up deposed).
//   - Every state is written by CAS on the previous state's revision by a
//     lease holder, and its epoch never decreases; under one epoch a target
//     has exactly one owner (sharded) and the cluster one leader
//     (active_passive).
//   - Shard ownership is rendezvous hashing (Owner), computable by any
//     client; a membership change moves only the targets of the members
//     that left or joined.
//   - A member's copy of the sync state converges to the leader's within one
//     sync interval of it being able to read the bucket.
//   - The leader takes nobody's place away for not reporting until its view
//     of the reports has been fresh for one failure threshold after a gap
//     (a reconnect, a re-sync, its first read): "I could not see" is not
//     "it is gone" (sight.go).
package cluster
