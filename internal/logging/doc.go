// Package logging builds Warden's zerolog loggers: JSON lines, or the console
// format when stderr is a terminal. Keys are snake_case; every logger carries
// a component field.
package logging
