package daemon

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
	labelled := regexp.MustCompile(`^VPN hub key file: ` + regexp.QuoteMeta(path) + ` \(the private key stays in it\)\npublic key: ([A-Za-z0-9_-]{43})\n$`)
	m := labelled.FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("keygen: %d %q", code, out)
	}
	// --show prints the same labelled public key of the file, never its private key.
	private, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	code, shown, stderr := runMain(t, nil, "keygen", "--show", path)
	if code != 0 || shown != out || stderr != "" {
		t.Fatalf("keygen --show: exit %d, stdout %q (keygen printed %q), stderr %q", code, shown, out, stderr)
	}
	if strings.Contains(shown, strings.TrimSpace(string(private))) {
		t.Fatalf("keygen --show printed the private key: %q", shown)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	if code, _, stderr := runMain(t, nil, "keygen", "--hub-key-file", path); code != 1 || !strings.Contains(stderr, "already exists") {
		t.Fatalf("keygen over an existing file: %d %q", code, stderr)
	}
}

func TestKeygenShowRefusals(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.key")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"keygen", "--show", missing}, "relay keygen: --show: read key file " + missing + ": no such file or directory\n"},
		{[]string{"keygen", "--show", missing, "--hub-key-file", missing}, "relay keygen: --hub-key-file, --replication-key-file and --show: one at a time\n"},
		{[]string{"keygen"}, "relay keygen: --hub-key-file, --replication-key-file or --show: one is required\n"},
	}
	for _, c := range cases {
		code, out, stderr := runMain(t, nil, c.args...)
		if code != 2 || out != "" || stderr != c.want {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 and %q", c.args, code, out, stderr, c.want)
		}
	}
}
