package daemon

import (
	"io"
	"os"

	"github.com/rs/zerolog"
)

// Every duration field (latency, wait) carries its unit: a Go duration string, "12.5ms", "1.5s",
// rather than zerolog's bare number of milliseconds. Set once for the process, before any logger
// writes; docs/logging.md says so.
func init() { zerolog.DurationFieldFormat = zerolog.DurationFormatString }

// NewLogger is the process's logger: level and format as the flags say, on w.
func NewLogger(level, format string, w io.Writer) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	if format == "console" {
		// Colour only on a terminal: escape codes in a CI log or a file are noise. Timestamps
		// carry whole seconds.
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05", NoColor: !isTerminal(w)}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger()
}

// isTerminal reports whether w is a character device, as a terminal is.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
