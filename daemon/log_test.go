package daemon

import (
	"bytes"
	"strings"
	"testing"
)

// Console logs written anywhere but a terminal (a CI log, a file) carry no colour escapes.
func TestConsoleLogsOffATerminalHaveNoColour(t *testing.T) {
	var out bytes.Buffer
	log := NewLogger("info", "console", &out)
	log.Warn().Str("component", "upstream").Msg("cannot reach Cloudly")
	if !strings.Contains(out.String(), "cannot reach Cloudly") || !strings.Contains(out.String(), "component=upstream") {
		t.Fatalf("console line lost its content: %q", out.String())
	}
	if strings.Contains(out.String(), "\x1b[") {
		t.Fatalf("console line off a terminal has colour escapes: %q", out.String())
	}
}
