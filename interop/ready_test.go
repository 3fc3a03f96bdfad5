package interop_test

import (
	"os"
	"path/filepath"
	"testing"

	"code.foss.global/serve.zone/relay/interop"
)

// Ready's error, which the suite skips with, names the one command that would make it run.
func TestReadySaysTheCommandThatMakesTheSuiteRun(t *testing.T) {
	bin := t.TempDir()
	t.Setenv("PATH", bin)
	dir := t.TempDir()
	want := "interop: node is not on PATH; to run this suite: apt-get install nodejs npm && bash interop/install.sh (Node.js ≥ 18)"
	if err := interop.Ready(dir); err == nil || err.Error() != want {
		t.Fatalf("without node: %v; want %q", err, want)
	}
	for _, tool := range []string{"node", "npm"} {
		if err := os.WriteFile(filepath.Join(bin, tool), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	want = "interop: the peers' packages are not installed (node_modules/ws/package.json is missing); to run this suite: bash interop/install.sh"
	if err := interop.Ready(dir); err == nil || err.Error() != want {
		t.Fatalf("without packages: %v; want %q", err, want)
	}
	os.Remove(filepath.Join(bin, "npm"))
	want = "interop: the peers' packages are not installed (node_modules/ws/package.json is missing); to run this suite: apt-get install npm && bash interop/install.sh"
	if err := interop.Ready(dir); err == nil || err.Error() != want {
		t.Fatalf("without npm: %v; want %q", err, want)
	}
}
