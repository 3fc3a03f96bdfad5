package main

import (
	"io"
	"os"

	"github.com/rs/zerolog"
)

func newLogger(level, format string, w io.Writer) zerolog.Logger {
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
