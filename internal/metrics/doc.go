// Package metrics exposes Warden's Prometheus metrics. Collectors are created
// and registered by the process that owns them (in cmd/), never in init(),
// so tests and embedded uses get private registries.
//
// Every process serves, on its metrics address, /metrics, /healthz (the
// process runs) and /readyz (it can do its work: the checks it was given
// pass).
package metrics
