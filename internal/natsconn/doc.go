// Package natsconn connects Warden processes to NATS the way the `nats` CLI
// does: server URL from --server or NATS_URL, credentials from --creds or
// NATS_CREDS, the CA of a TLS deployment from NATS_CA. Connections reconnect
// forever; the processes treat a lost connection as a transient error.
//
// Every connection uses its own inbox prefix (InboxPrefix): the one its
// credential may subscribe to, so that no identity can read another's
// replies. A permissions violation the server reports is logged with the
// subject and the identity, and kept for the connection (Explain,
// OnPermissionError) so callers report it as what it is, never as an
// unavailable server.
package natsconn
