package logging

import (
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

// NewTo is New with an explicit writer.
func NewTo(w io.Writer, component, level string) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		lvl = zerolog.InfoLevel
	}
	out := w
	format := os.Getenv("WARDEN_LOG_FORMAT")
	if f, ok := w.(*os.File); (ok && format == "" && isatty.IsTerminal(f.Fd())) || format == "console" {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(out).Level(lvl).With().Timestamp().Str("component", component).Logger()
}
