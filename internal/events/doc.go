// Package events publishes Warden's audit trail to the WARDEN_EVENTS stream.
// An event is published with a JetStream publish and the PubAck awaited, so
// an event a caller was told about is durable.
//
// Every event carries a Nats-Msg-Id derived from what it describes (never
// from when or by whom it was published), so the same event published twice
// — a retry, or two supervisor leaders across a takeover — is stored once
// within the stream's duplicate window.
package events
