// Package cluster tests agent clusters (internal/cluster, docs/clusters.md)
// end to end: membership, leader election by lease, failover and shard
// rebalancing with real agent processes (kill, SIGSTOP, split brain) and the
// real scheduler routing through a cluster.
package cluster
