package daemon

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/relay"
)

// runMain runs the relay command built as the default version: exit status, stdout, stderr.
func runMain(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	return runMainAs(t, relay.DefaultBuildVersion, env, args...)
}

// runMainAs is runMain for a binary built as version.
func runMainAs(t *testing.T, version string, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var out, errOut bytes.Buffer
	code := Main(context.Background(), version, args, &out, &errOut)
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
		{"missing required", []string{"run"}, nil, "relay run: missing required flags --cluster-id, --node-id, --cloudly-url, --cloudly-token-file, " +
			"--advertise-address, --tls-cert-file, --tls-key-file (--tls-cert-file, --tls-key-file: not needed with --insecure-plaintext); " +
			"each can also come from its SERVEZONE_RELAY_* variable\n"},
		{"bad node id", append(append([]string{}, base...), "--node-id", "node a"), nil, "--node-id: must be a cluster node id"},
		{"unreadable token file", append(append([]string{}, base...), "--cloudly-token-file", filepath.Join(dir, "missing")), nil, "--cloudly-token-file: cannot read"},
		{"plaintext URL without the flag", []string{"run", "--cluster-id", "c1", "--node-id", "n1", "--cloudly-url", "ws://cloudly.example/",
			"--cloudly-token-file", token, "--advertise-address", "192.0.2.10", "--tls-cert-file", token, "--tls-key-file", token}, nil, "--cloudly-url: ws:// needs --insecure-plaintext"},
		{"loopback advertise address", append(append([]string{}, base...), "--advertise-address", "127.0.0.1"), nil, "--advertise-address: must be a unicast IPv4"},
		{"bad value from the environment", base, map[string]string{"SERVEZONE_RELAY_MAX_MESSAGE_BYTES": "lots"},
			`relay run: --max-message-bytes (from SERVEZONE_RELAY_MAX_MESSAGE_BYTES="lots"): must be a number of bytes, plain or with a unit: ` +
				"65536, 64KiB, 8MiB, 10GiB (KiB, MiB, GiB, TiB: powers of 1024)\n"},
		{"value from the environment judged", base, map[string]string{"SERVEZONE_RELAY_LOG_FORMAT": "xml"},
			`relay run: --log-format (from SERVEZONE_RELAY_LOG_FORMAT="xml"): must be json or console` + "\n"},
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

// realMain is Main for a binary built as the default version.
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return Main(ctx, relay.DefaultBuildVersion, args, stdout, stderr)
}
