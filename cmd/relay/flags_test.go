package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/relay"
)

// TestHelpListsEveryFlag checks what the top-level usage promises: "relay <command> -h" lists the
// command's flags, each with its environment variable and default, and exits 0. The image carries
// no documentation, so this is all an operator in a container has.
func TestHelpListsEveryFlag(t *testing.T) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var cfg relay.Config
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
	if code, out, _ := runMain(t, nil, "dev", "-h"); code != 0 || !strings.Contains(out, "--nodes") || !strings.Contains(out, "--duration") {
		t.Fatalf("dev -h: exit %d, %q", code, out)
	}
	if code, out, _ := runMain(t, nil, "keygen", "-h"); code != 0 || !strings.Contains(out, "--hub-key-file") {
		t.Fatalf("keygen -h: exit %d, %q", code, out)
	}
}

// TestOperatingDocListsEveryRunFlag checks docs/operating.md's flag table against the flags
// `relay run` defines: every flag has a row, and a non-empty text default is the one in the code.
func TestOperatingDocListsEveryRunFlag(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(doc), "\n## Flags and environment\n")
	table, _, _ = strings.Cut(table, "\n## ")
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var cfg relay.Config
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
