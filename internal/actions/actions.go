package actions

import (
	"context"
	"encoding/json"
	"sort"
)

// Func is an action: it receives the task's raw JSON parameters and returns
// an output that is encoded as JSON into the result.
type Func func(ctx context.Context, params json.RawMessage) (any, error)

// Names of the built-in actions.
const (
	NameEcho  = "echo"
	NameSleep = "sleep"
	NameShell = "shell"
	NameHTTP  = "http"
)

// Config configures the built-ins that need it.
type Config struct {
	Shell ShellConfig
	HTTP  HTTPConfig
}

// Builtins returns every built-in action by name.
func Builtins(cfg Config) map[string]Func {
	return map[string]Func{
		NameEcho:  Echo,
		NameSleep: Sleep,
		NameShell: Shell(cfg.Shell),
		NameHTTP:  HTTP(cfg.HTTP),
	}
}

// BuiltinNames lists the built-in action names, sorted.
func BuiltinNames() []string {
	names := make([]string, 0, 4)
	for n := range Builtins(Config{}) {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
