package daemon

import (
	"bytes"
	"context"
	"flag"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestHelpListsEveryFlag checks what the top-level usage promises: "relay <command> -h" lists the
// command's flags, each with its environment variable and default, and exits 0. The image carries
// no documentation, so this is all an operator in a container has.
func TestHelpListsEveryFlag(t *testing.T) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var cfg Config
	runFlags(fs, &cfg)
	for _, arg := range []string{"-h", "--help"} {
		code, out, stderr := runMain(t, nil, "run", arg)
		if code != 0 || stderr != "" {
			t.Fatalf("run %s: exit %d, stderr %q", arg, code, stderr)
		}
		fs.VisitAll(func(f *flag.Flag) {
			line := regexp.MustCompile(`(?m)^  --` + regexp.QuoteMeta(f.Name) + `\s+` + envName(f.Name) + `\s.*$`).FindString(out)
			if line == "" {
				t.Errorf("run %s does not list --%s with %s:\n%s", arg, f.Name, envName(f.Name), out)
			} else if f.DefValue != "" && f.DefValue != "false" && !strings.Contains(line, "(default "+f.DefValue+")") {
				t.Errorf("run %s: --%s line %q lacks its default %s", arg, f.Name, line, f.DefValue)
			}
		})
	}
	// The demo left the daemon: `relay-dev` says where it went, and runs nothing.
	if code, out, stderr := runMain(t, nil, "dev", "-h"); code != 2 || out != "" || stderr != "relay dev: "+devMoved+"\n" {
		t.Fatalf("dev -h: exit %d, stdout %q, stderr %q; want 2 and one line naming cmd/relay-dev", code, out, stderr)
	}
	if code, out, _ := runMain(t, nil, "keygen", "-h"); code != 0 || !strings.Contains(out, "--hub-key-file") {
		t.Fatalf("keygen -h: exit %d, %q", code, out)
	}
}

// TestOperatingDocListsEveryRunFlag checks docs/operating.md's flag table against the flags
// `relay run` defines: every flag has a row, and a non-empty text default is the one in the code.
func TestOperatingDocListsEveryRunFlag(t *testing.T) {
	doc, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(doc), "\n## Flags and environment\n")
	table, _, _ = strings.Cut(table, "\n## ")
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var cfg Config
	runFlags(fs, &cfg)
	fs.VisitAll(func(f *flag.Flag) {
		row := regexp.MustCompile("(?m)^\\| [^|]*`--" + regexp.QuoteMeta(f.Name) + "`[^|]*\\|([^|]*)\\|.*$").FindStringSubmatch(table)
		if row == nil {
			t.Errorf("docs/operating.md has no flag table row for --%s", f.Name)
			return
		}
		if _, isNumber := f.Value.(flag.Getter).Get().(int64); f.DefValue != "" && f.DefValue != "false" && !isNumber &&
			!strings.Contains(row[1], "`"+f.DefValue+"`") {
			t.Errorf("docs/operating.md gives --%s the default %q; the code's is %s", f.Name, strings.TrimSpace(row[1]), f.DefValue)
		}
	})
}

// TestBadValuesAndFilesExit2NamingTheFlag runs `relay run` with one bad value or file at a time
// and checks docs/operating.md#flags-and-environment: exit 2, one line, naming the flag, never quoting a file's content. The
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

// runArgs is a `relay <cmd>` command line with every required flag, listeners on loopback port 0
// and plaintext, followed by extra.
func runArgs(t *testing.T, cmd string, extra ...string) []string {
	t.Helper()
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("jwt\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return append([]string{cmd, "--cluster-id", "c1", "--node-id", "n1", "--cloudly-url", "ws://127.0.0.1:1/",
		"--cloudly-token-file", token, "--advertise-address", "192.0.2.10", "--insecure-plaintext",
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, extra...)
}

// Every size flag takes the sizes the docs write (8MiB, 256MiB, 10GiB) and plain bytes, and help
// shows its default in the same units.
func TestSizeFlagsTakeUnits(t *testing.T) {
	for in, want := range map[string]int64{"65536": 65536, "64KiB": 64 << 10, "8MiB": 8 << 20, "8 MiB": 8 << 20,
		"256MiB": 256 << 20, "10GiB": 10 << 30, "1TiB": 1 << 40, "4096B": 4096} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "lots", "8MB", "8mib", "1.5GiB", "-1", "MiB", "9999999999TiB"} {
		if got, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) = %d; want an error", in, got)
		}
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var cfg Config
	runFlags(fs, &cfg)
	for name, want := range map[string]string{"max-message-bytes": "8MiB", "peer-memory-bytes": "256MiB", "registry-cache-max-bytes": "10GiB"} {
		if got := fs.Lookup(name).DefValue; got != want {
			t.Errorf("--%s default shown as %q, want %q", name, got, want)
		}
	}
	t.Setenv("SERVEZONE_RELAY_PEER_MEMORY_BYTES", "512MiB")
	if _, err := parse(fs, []string{"--max-message-bytes", "16MiB", "--registry-cache-max-bytes=20GiB"}); err != nil {
		t.Fatal(err)
	}
	if cfg.MaxMessageBytes != 16<<20 || cfg.PeerMemoryBytes != 512<<20 || cfg.RegistryCacheMaxBytes != 20<<30 {
		t.Fatalf("parsed %d %d %d", cfg.MaxMessageBytes, cfg.PeerMemoryBytes, cfg.RegistryCacheMaxBytes)
	}
	if code, _, stderr := runMain(t, nil, runArgs(t, "run", "--max-message-bytes", "8MB")...); code != 2 ||
		stderr != `relay run: --max-message-bytes="8MB": must be a number of bytes, plain or with a unit: 65536, 64KiB, 8MiB, 10GiB (KiB, MiB, GiB, TiB: powers of 1024)`+"\n" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

// `relay run -h` marks every required flag, and each flag that needs another.
func TestHelpMarksRequiredFlags(t *testing.T) {
	_, out, _ := runMain(t, nil, "run", "-h")
	for flag, note := range map[string]string{"cluster-id": "[required]", "node-id": "[required]", "cloudly-url": "[required]",
		"cloudly-token-file": "[required]", "advertise-address": "[required]",
		"tls-cert-file": "[required unless --insecure-plaintext]", "tls-key-file": "[required unless --insecure-plaintext]",
		"hub-key-file": "[required with --hub-listen]", "ha-replication-key-file": "[required with --ha-lease-name]",
		"registry-cache-dir": "[needs --registry-upstream]", "hub-advertise-address": "[needs --hub-listen]",
		"kubeconfig": "[needs --ha-lease-name]"} {
		line := regexp.MustCompile(`(?m)^  --` + flag + `\s.*$`).FindString(out)
		if !strings.HasSuffix(line, note) {
			t.Errorf("--%s help line %q does not end %s", flag, line, note)
		}
	}
	if line := regexp.MustCompile(`(?m)^  --listen\s.*$`).FindString(out); strings.Contains(line, "[") {
		t.Errorf("--listen is marked: %q", line)
	}
}

// Refusals that explain themselves: a flag that needs another says so, from the command line or
// its variable; an empty token file is refused at start; the canonical identifier rule is spelt
// out; a bad value from the environment names the variable, the value and the rule, but never
// quotes a URL (it may carry credentials).
func TestRefusalsStateTheRule(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.jwt")
	if err := os.WriteFile(empty, []byte("\n \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"cache dir without upstream", runArgs(t, "run", "--registry-cache-dir", dir), nil,
			"relay run: --registry-cache-dir needs --registry-upstream; without it --registry-cache-dir would be ignored\n"},
		{"cache dir without upstream, from the environment", runArgs(t, "run"), map[string]string{"SERVEZONE_RELAY_REGISTRY_CACHE_DIR": dir},
			`relay run: --registry-cache-dir (from SERVEZONE_RELAY_REGISTRY_CACHE_DIR="` + dir + `") needs --registry-upstream; without it --registry-cache-dir would be ignored` + "\n"},
		{"hub key without hub", runArgs(t, "run", "--hub-key-file", filepath.Join(dir, "hub.key")), nil,
			"relay run: --hub-key-file needs --hub-listen; without it --hub-key-file would be ignored\n"},
		{"HA flag without the Lease", runArgs(t, "run", "--ha-identity", "relay-0"), nil,
			"relay run: --ha-identity needs --ha-lease-name; without it --ha-identity would be ignored\n"},
		{"hub without its key", runArgs(t, "run", "--hub-listen", "192.0.2.10:51820"), nil,
			"relay run: missing required flag --hub-key-file; a flag can also come from its SERVEZONE_RELAY_* variable\n"},
		{"empty token file", runArgs(t, "run", "--cloudly-token-file", empty), nil,
			"relay run: --cloudly-token-file: " + empty + " is empty: it must hold the relay's machine JWT\n"},
		{"empty token file, checked", runArgs(t, "check", "--cloudly-token-file", empty), nil,
			"relay check: --cloudly-token-file: " + empty + " is empty: it must hold the relay's machine JWT\n"},
		{"cluster id", runArgs(t, "run", "--cluster-id", "cluster a"), nil,
			"relay run: --cluster-id: must be a canonical identifier: a letter or digit, then up to 199 of A-Z a-z 0-9 : . _ -\n"},
		{"duration from the environment", runArgs(t, "run"), map[string]string{"SERVEZONE_RELAY_HA_LEASE_DURATION": "6"},
			`relay run: --ha-lease-duration (from SERVEZONE_RELAY_HA_LEASE_DURATION="6"): must be a duration with its unit, such as 500ms, 6s or 2m` + "\n"},
		{"count from the environment", runArgs(t, "run"), map[string]string{"SERVEZONE_RELAY_MAX_UNREGISTERED_PER_SOURCE": "many"},
			`relay run: --max-unregistered-per-source (from SERVEZONE_RELAY_MAX_UNREGISTERED_PER_SOURCE="many"): must be a whole number` + "\n"},
		{"HA address from the environment", runArgs(t, "run", "--ha-lease-name", "relay", "--ha-lease-namespace", "ns", "--ha-identity", "relay-0",
			"--ha-replication-key-file", filepath.Join(dir, "replication.key")), map[string]string{"SERVEZONE_RELAY_HA_REPLICATION_LISTEN": "8444"},
			`relay run: --ha-replication-listen (from SERVEZONE_RELAY_HA_REPLICATION_LISTEN="8444"): must be host:port or :port` + "\n"},
		{"URL from the environment", []string{"run", "--cluster-id", "c1", "--node-id", "n1", "--cloudly-token-file", empty,
			"--advertise-address", "192.0.2.10", "--insecure-plaintext"}, map[string]string{"SERVEZONE_RELAY_CLOUDLY_URL": "https://user:s3cret@cloudly.example/"},
			"relay run: --cloudly-url (from SERVEZONE_RELAY_CLOUDLY_URL; its value is not shown: a URL may carry credentials): must be a wss:// URL\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, stderr := runMain(t, c.env, c.args...)
			if code != 2 || out != "" || stderr != c.want {
				t.Fatalf("exit %d, stdout %q, stderr %q; want 2 and %q", code, out, stderr, c.want)
			}
		})
	}
}

// `relay check` judges what `relay run` would, binds and dials nothing, and creates no file: it
// passes while another process holds the listen addresses, and a missing hub key stays missing.
func TestCheckJudgesWithoutBinding(t *testing.T) {
	down, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	key := filepath.Join(t.TempDir(), "hub.key")
	code, out, stderr := runMain(t, nil, runArgs(t, "check", "--listen", down.Addr().String(), "--admin-listen", admin.Addr().String(),
		"--hub-listen", "192.0.2.10:51820", "--hub-key-file", key, "--max-message-bytes", "16MiB")...)
	want := "relay check: configuration valid (nothing dialled or bound); on: escrow, ingress, restore, platform, vpnhub; off: tls, registry, registry-cache, ha\n"
	if code != 0 || out != want || stderr != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0 and %q", code, out, stderr, want)
	}
	if _, err := os.Stat(key); !os.IsNotExist(err) {
		t.Fatalf("check created the hub key file: %v", err)
	}
	// What run refuses, check refuses the same way.
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	os.WriteFile(notPEM, []byte("s3cret\n"), 0o600)
	code, _, stderr = runMain(t, nil, runArgs(t, "check", "--cloudly-ca-file", notPEM)...)
	if code != 2 || stderr != "relay check: --cloudly-ca-file: "+notPEM+" holds no PEM certificate\n" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runMain(t, nil, runArgs(t, "check", "--hub-listen", "127.0.0.1:51820", "--hub-key-file", key)...)
	if code != 2 || !strings.HasPrefix(stderr, "relay check: --hub-listen: must be a unicast IPv4 address") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runMain(t, nil, "check")
	if code != 2 || !strings.HasPrefix(stderr, "relay check: missing required flags --cluster-id, --node-id") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}
