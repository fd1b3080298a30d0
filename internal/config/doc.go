// Package config loads a component's YAML configuration strictly: unknown
// fields are errors, so a typo never silently falls back to a default.
//
// Invariants: an unknown or misspelt field is an error, never ignored; a
// field the file omits keeps the default the caller filled in; an empty path
// changes nothing. Precedence over the environment and flags is
// internal/daemon's (flag > environment > file > default).
package config
