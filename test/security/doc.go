// Package security tests the deployed permission model with each role's
// NATS credential (internal/creds, docs/security.md): each role can do its
// part of the protocol and is refused everything else — an agent acting
// for another, a publisher doing more than submit, a read-only CLI
// changing anything, any role but setup changing streams or forging
// advisories.
package security
