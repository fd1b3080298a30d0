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
//   - A candidate campaigns until its context ends, through any outage:
//     a failed watch or Create (the server down or restarting, a request
//     timed out) is retried with a backoff from 50 ms up to TTL/4, as the
//     connection reconnects forever. A leader that stepped down because
//     the server went away therefore leads again once it is back. Run
//     returns an error only for what no retry mends: a closed connection,
//     or a key the server refuses (New rejects such a key up front).
package lease
