package daemon

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
)

// TestBuildServesRegistryOnDownstream checks the wiring: with --registry-upstream, build() gives
// the relay a /v2/ handler that forwards to the upstream, its metrics in the relay's registry.
func TestBuildServesRegistryOnDownstream(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Docker-Distribution-Api-Version", "registry/2.0")
		w.Header().Set("X-Seen-Path", r.URL.Path)
		io.WriteString(w, "{}")
	}))
	t.Cleanup(upstream.Close) // after the relay has stopped
	e := relaytest.Start(t, relaytest.Options{Quiet: true,
		Build:     buildWith(Config{RegistryCacheDir: filepath.Join(t.TempDir(), "cache"), RegistryCacheMaxBytes: defaultRegistryCacheMaxBytes}),
		Configure: func(cfg *relay.Config) { cfg.RegistryUpstream = upstream.URL }})
	r := e.Relay

	resp, err := http.Get("http://" + r.DownstreamAddr().String() + "/v2/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Seen-Path") != "/v2/" {
		t.Fatalf("GET /v2/ through the relay: %d, upstream saw %q", resp.StatusCode, resp.Header.Get("X-Seen-Path"))
	}
	resp, err = http.Get("http://" + r.AdminAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `relay_registry_requests_total{kind="other",method="get"} 1`) {
		t.Fatalf("registry metrics missing from the relay's /metrics")
	}
}

func TestRegistryUpstreamWithCredentialsExits2WithoutQuotingThem(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("jwt\n"), 0o600)
	code, _, stderr := runMain(t, nil, "run", "--cluster-id", "c1", "--node-id", "n1", "--cloudly-url", "wss://cloudly.example/",
		"--cloudly-token-file", token, "--advertise-address", "192.0.2.10", "--insecure-plaintext",
		"--registry-upstream", "https://robot:hunter2@registry.example")
	if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "--registry-upstream") {
		t.Fatalf("exit %d, stderr %q: want 2 and one line naming --registry-upstream", code, stderr)
	}
	if strings.Contains(stderr, "hunter2") {
		t.Fatalf("stderr quotes the password: %q", stderr)
	}
	code, _, stderr = runMain(t, nil, "run", "--cluster-id", "c1", "--node-id", "n1", "--cloudly-url", "wss://cloudly.example/",
		"--cloudly-token-file", token, "--advertise-address", "192.0.2.10", "--insecure-plaintext",
		"--registry-upstream", "https://registry.example", "--registry-cache-max-bytes", "1000")
	if code != 2 || !strings.Contains(stderr, "--registry-cache-max-bytes: must be at least") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
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
