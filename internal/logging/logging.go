package logging

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
)

// Field names shared by every component, so a job's life can be grepped.
const (
	FieldJob   = "job_id"
	FieldStep  = "step_id"
	FieldAgent = "agent_id"
	FieldEpoch = "epoch"
)

func init() {
	// A package-level setting of zerolog's: set once here, never per logger,
	// so that building a logger cannot race with goroutines that log.
	zerolog.TimeFieldFormat = time.RFC3339Nano
}

// New returns a logger for component writing to stderr at level
// (debug, info, warn, error; default info). WARDEN_LOG_FORMAT=json|console
// overrides the terminal detection.
func New(component, level string) zerolog.Logger {
	return NewTo(os.Stderr, component, level)
}

// CheckLevel reports a level New would not know; empty is the default.
// New itself falls back to info, so a process checks its configured level
// at start: a typo must not quietly log at another level.
func CheckLevel(level string) error {
	_, err := parseLevel(level)
	return err
}

// parseLevel reads one of the documented levels (empty: info).
func parseLevel(level string) (zerolog.Level, error) {
	switch strings.ToLower(level) {
	case "", "info":
		return zerolog.InfoLevel, nil
	case "debug":
		return zerolog.DebugLevel, nil
	case "warn":
		return zerolog.WarnLevel, nil
	case "error":
		return zerolog.ErrorLevel, nil
	}
	return zerolog.InfoLevel, fmt.Errorf("log_level must be debug, info, warn or error, got %q", level)
}

// NewTo is New with an explicit writer.
func NewTo(w io.Writer, component, level string) zerolog.Logger {
	lvl, _ := parseLevel(level) // info when unknown: CheckLevel refuses it at start
	out := w
	format := os.Getenv("WARDEN_LOG_FORMAT")
	if f, ok := w.(*os.File); (ok && format == "" && isatty.IsTerminal(f.Fd())) || format == "console" {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(out).Level(lvl).With().Timestamp().Str("component", component).Logger()
}
