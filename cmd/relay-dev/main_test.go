package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// runMain runs the demo with args until it ends: exit status, stdout, stderr.
func runMain(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var out, errOut bytes.Buffer
	code := realMain(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestHelpListsTheDemosFlags: -h prints the demo's flags under its own name and exits 0.
func TestHelpListsTheDemosFlags(t *testing.T) {
	code, out, _ := runMain(t, nil, "-h")
	if code != 0 || !strings.HasPrefix(out, "usage: relay-dev [flags]\n") || !strings.Contains(out, "--nodes") || !strings.Contains(out, "--duration") ||
		!strings.Contains(out, "--replicas") {
		t.Fatalf("-h: exit %d, %q; want 0 and the demo's flags", code, out)
	}
}
