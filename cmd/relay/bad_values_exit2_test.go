package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBadValuesAndFilesExit2NamingTheFlag runs `relay run` with one bad value or file at a time
// and checks SPEC §11: exit 2, one line, naming the flag, never quoting a file's content. The
// listeners are on loopback port 0 so that a case that wrongly starts binds nothing fixed.
func TestBadValuesAndFilesExit2NamingTheFlag(t *testing.T) {
	dir := t.TempDir()
	const secret = "s3cret-material-never-printed"
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	token := write("token", "jwt\n")
	notPEM := write("not.pem", secret+"\n")
	badKey := write("bad.key", "-----BEGIN PRIVATE KEY-----\n"+secret+"\n-----END PRIVATE KEY-----\n")
	aDir := filepath.Join(dir, "a-directory")
	if err := os.Mkdir(aDir, 0o700); err != nil {
		t.Fatal(err)
	}
	base := func(extra ...string) []string {
		return append([]string{"run", "--cluster-id", "c1", "--node-id", "n1", "--cloudly-url", "wss://127.0.0.1:1/",
			"--cloudly-token-file", token, "--advertise-address", "192.0.2.10",
			"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, extra...)
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"admin port out of range", base("--insecure-plaintext", "--admin-listen", "127.0.0.1:99999"), "--admin-listen:"},
		{"admin port negative", base("--insecure-plaintext", "--admin-listen", "127.0.0.1:-1"), "--admin-listen:"},
		{"admin port not a number", base("--insecure-plaintext", "--admin-listen", "127.0.0.1:http"), "--admin-listen:"},
		{"tls certificate without PEM", base("--tls-cert-file", notPEM, "--tls-key-file", badKey), "--tls-cert-file:"},
		{"cloudly CA without PEM", base("--insecure-plaintext", "--cloudly-ca-file", notPEM), "--cloudly-ca-file:"},
		{"token file is a directory", base("--insecure-plaintext", "--cloudly-token-file", aDir), "--cloudly-token-file:"},
		{"cloudly CA is a directory", base("--insecure-plaintext", "--cloudly-ca-file", aDir), "--cloudly-ca-file:"},
		{"tls key is a directory", base("--tls-cert-file", notPEM, "--tls-key-file", aDir), "--tls-key-file:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// A case that wrongly starts the relay is stopped after a few seconds (exit 0 or 1).
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			var out, errOut bytes.Buffer
			code := realMain(ctx, append([]string{}, c.args...), &out, &errOut)
			stderr := errOut.String()
			if code != 2 && len(stderr) > 300 {
				stderr = stderr[:300] + "…"
			}
			if code != 2 {
				t.Fatalf("exit %d, want 2 (stderr %q)", code, stderr)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.want) {
				t.Fatalf("stderr = %q, want one line containing %q", stderr, c.want)
			}
			if strings.Contains(stderr, secret) {
				t.Fatalf("stderr quotes a file's content: %q", stderr)
			}
		})
	}
}
