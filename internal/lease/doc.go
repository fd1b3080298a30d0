// Package lease elects one leader among processes sharing a key in the
// warden_leases bucket, as choria-io/asyncjobs does:
//
//   - A candidate wins by Create on the key; it fails while another holds it.
//   - The leader keeps the key by CAS Update every RenewEvery (about 75% of
//     the bucket's TTL). Each write resets the key's age, so the TTL removes
//     the key only when renewals stop.
//   - A leader whose renewal fails, or whose last successful renewal is older
//     than the TTL, steps down at once: its leader context is cancelled
//     before another candidate can have won.
//   - The revision of the winning Create is the leader's fencing epoch; every
//     later leader has a higher one.
//   - Standbys watch the key and campaign as soon as it is deleted or
//     expires, so a takeover happens within TTL plus the expiry marker's
//     delay (about 200–350 ms) of the leader's death.
package lease
