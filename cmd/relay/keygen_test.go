package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestVersionAndKeygen(t *testing.T) {
	code, out, _ := runMain(t, nil, "version")
	if code != 0 || !strings.Contains(out, "interfaces 32.36.0") {
		t.Fatalf("version: %d %q", code, out)
	}
	path := filepath.Join(t.TempDir(), "hub.key")
	code, out, _ = runMain(t, nil, "keygen", "--hub-key-file", path)
	if code != 0 || !regexp.MustCompile(`^[A-Za-z0-9_-]{43}\n$`).MatchString(out) {
		t.Fatalf("keygen: %d %q", code, out)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	if code, _, stderr := runMain(t, nil, "keygen", "--hub-key-file", path); code != 1 || !strings.Contains(stderr, "already exists") {
		t.Fatalf("keygen over an existing file: %d %q", code, stderr)
	}
}
