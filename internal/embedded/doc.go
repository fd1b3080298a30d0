// Package embedded runs a NATS server with JetStream inside the process, for
// `warden dev` and for tests. Production runs a real nats-server cluster.
//
// Invariants: Start returns only once the server accepts connections (or an
// error naming the port); JetStream data lives only in the given store
// directory.
package embedded
