package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func runMain(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var out, errOut bytes.Buffer
	code := realMain(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestBadCommandLinesExit2WithOneLine(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("jwt\n"), 0o600)
	base := []string{"run", "--cluster-id", "c1", "--node-id", "-n1", "--cloudly-url", "wss://cloudly.example/",
		"--cloudly-token-file", token, "--advertise-address", "192.0.2.10", "--insecure-plaintext"}
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"unknown flag", []string{"run", "--no-such-flag"}, nil, "unknown flag --no-such-flag"},
		{"missing required", []string{"run"}, nil, "--cluster-id: is required"},
		{"bad node id", append(append([]string{}, base...), "--node-id", "node a"), nil, "--node-id: must be a cluster node id"},
		{"unreadable token file", append(append([]string{}, base...), "--cloudly-token-file", filepath.Join(dir, "missing")), nil, "--cloudly-token-file: cannot read"},
		{"plaintext URL without the flag", []string{"run", "--cluster-id", "c1", "--node-id", "n1", "--cloudly-url", "ws://cloudly.example/",
			"--cloudly-token-file", token, "--advertise-address", "192.0.2.10", "--tls-cert-file", token, "--tls-key-file", token}, nil, "--cloudly-url: ws:// needs --insecure-plaintext"},
		{"loopback advertise address", append(append([]string{}, base...), "--advertise-address", "127.0.0.1"), nil, "--advertise-address: must be a unicast IPv4"},
		{"bad value from the environment", base, map[string]string{"SERVEZONE_RELAY_MAX_MESSAGE_BYTES": "lots"}, "--max-message-bytes (from SERVEZONE_RELAY_MAX_MESSAGE_BYTES): invalid value"},
		{"value from the environment judged", base, map[string]string{"SERVEZONE_RELAY_LOG_FORMAT": "xml"}, "--log-format: must be json or console"},
		{"unknown command", []string{"frobnicate"}, nil, `unknown command "frobnicate"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := runMain(t, c.env, c.args...)
			if code != 2 {
				t.Fatalf("exit %d, want 2 (stderr %q)", code, stderr)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.want) {
				t.Fatalf("stderr = %q, want one line containing %q", stderr, c.want)
			}
		})
	}
}

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

// TestDevRunsAndSummarizes runs `relay dev` for a few seconds, as the README's first command does,
// and checks every count the simulated peers observed is above zero.
func TestDevRunsAndSummarizes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole relay for seconds")
	}
	code, out, stderr := runMain(t, nil, "dev", "--duration", "8s", "--nodes", "5")
	if code != 0 {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	summary := lines[len(lines)-1]
	m := regexp.MustCompile(`^nodes=(\d+) requests=(\d+) vpnPackets=(\d+) escrowReleased=(\d+) routeTables=(\d+) restores=(\d+) streams=(\d+) outages=(\d+) recoveries=(\d+)` +
		` platformStates=(\d+) backups=(\d+) platformRestores=(\d+)$`).FindStringSubmatch(summary)
	if m == nil {
		t.Fatalf("last line is not the summary: %q", summary)
	}
	if m[1] != "5" {
		t.Fatalf("summary %q: want 5 nodes", summary)
	}
	for i, name := range []string{"requests", "vpnPackets", "escrowReleased", "routeTables", "restores", "streams", "outages", "recoveries",
		"platformStates", "backups", "platformRestores"} {
		if m[i+2] == "0" {
			t.Errorf("summary %q: %s is 0; every part of the scenario must have run", summary, name)
		}
	}
}

func TestRegistryFlagsAreJudgedAtStart(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("jwt\n"), 0o600)
	code, _, stderr := runMain(t, nil, "run", "--cluster-id", "c1", "--node-id", "n1", "--cloudly-url", "wss://cloudly.example/",
		"--cloudly-token-file", token, "--advertise-address", "192.0.2.10", "--insecure-plaintext",
		"--registry-upstream", "https://user:s3cret-pass@registry.example")
	if code != 2 || !strings.Contains(stderr, "--registry-upstream: must carry no credentials") || strings.Contains(stderr, "s3cret") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	empty := filepath.Join(dir, "empty.pem")
	os.WriteFile(empty, []byte("no certificate here"), 0o600)
	code, _, stderr = runMain(t, nil, "run", "--cluster-id", "c1", "--node-id", "n1", "--cloudly-url", "wss://cloudly.example/",
		"--cloudly-token-file", token, "--advertise-address", "192.0.2.10", "--insecure-plaintext",
		"--registry-upstream", "https://registry.example", "--registry-ca-file", empty, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	if code != 2 || !strings.Contains(stderr, "--registry-ca-file:") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

// Console logs written anywhere but a terminal (a CI log, a file) carry no colour escapes.
func TestConsoleLogsOffATerminalHaveNoColour(t *testing.T) {
	var out bytes.Buffer
	log := newLogger("info", "console", &out)
	log.Warn().Str("component", "upstream").Msg("cannot reach Cloudly")
	if !strings.Contains(out.String(), "cannot reach Cloudly") || !strings.Contains(out.String(), "component=upstream") {
		t.Fatalf("console line lost its content: %q", out.String())
	}
	if strings.Contains(out.String(), "\x1b[") {
		t.Fatalf("console line off a terminal has colour escapes: %q", out.String())
	}
}
