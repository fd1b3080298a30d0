package agent

import "github.com/wardenhq/warden/pkg/agent/internal/testhook"

// The test kit (agenttest) reaches these hooks through an internal package,
// so they stay out of the public API.
func init() {
	testhook.Option = func(h *testhook.Hooks) any { return Option(func(a *Agent) { a.hooks = h }) }
}
