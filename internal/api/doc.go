// Package api is Warden's HTTP API (/api/v1), its web dashboard (/) and
// its NATS micro services. Every route calls the operations facade
// (internal/ops), the same code the warden CLI runs, so the CLI's exit code,
// the API's HTTP status and a micro endpoint's error code come from one
// classification (ops.Code).
//
// Routing uses the standard library's http.ServeMux with Go 1.22 patterns
// ("GET /api/v1/jobs/{id}"): methods and path wildcards are all the API
// needs, it adds no dependency, and 405s with an Allow header come for free.
//
// Guarantees: every error is one JSON shape ({"error": {"code", "message",
// "status"}}) with a stable code; request bodies are bounded
// (Config.MaxBodyBytes); every /api/v1 route but the OpenAPI document needs
// a bearer token with the route's scope (read or admin) unless
// Config.AnonymousScope grants it; the embedded OpenAPI document lists
// exactly the routes served (a test checks it).
package api
