// Package creds makes Warden's NATS identities for operator/JWT mode: an
// operator, the WARDEN account (JetStream), the system account, one user
// per fixed role (Roles) and one per agent (Agent), each allowed only the
// subjects its process uses, and the server configuration that trusts them.
//
// A generated directory holds:
//
//	manifest.json            public keys, task_shards, issued and revoked users
//	keys/                    seeds and the CA key: never mount these anywhere
//	server/server.conf       a complete nats-server config (node name from $NATS_SERVER_NAME)
//	server/auth.conf         operator, system account, resolver: MEMORY with the account JWTs
//	server/tls/              server certificate, key and CA (with TLS)
//	creds/<role>.creds       setup, scheduler, supervisor, publisher, readonly, admin, api, sys
//	creds/agents/<pool>.<id>.creds
//	creds/ca.pem             the CA clients verify the servers with (with TLS)
//
// Guarantees: an agent's credential lets it pull only its own durable task
// consumer (named after it, filtered on its own task subject) on its own
// shard stream, write only its own presence key, publish only results and
// dead letters naming itself, and subscribe only to its own control
// subject and inbox prefix (InboxPrefix). Only the setup identity may
// create, change or delete streams. No identity may publish on $JS.EVENT.>.
package creds
