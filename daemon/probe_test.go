package daemon

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"testing"
)

// `relay probe` exits 0 on /healthz 200 and 1 otherwise; without --url it probes the address
// --admin-listen (or its variable, as in the image) names, a wildcard host on loopback.
func TestProbe(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	want := "http://127.0.0.1:" + port + "/healthz"

	code, out, stderr := runMain(t, nil, "probe", "--url", srv.URL+"/healthz")
	if code != 0 || out != "relay probe: "+srv.URL+"/healthz: 200 OK\n" || stderr != "" {
		t.Fatalf("probe --url: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	code, out, _ = runMain(t, map[string]string{"SERVEZONE_RELAY_ADMIN_LISTEN": ":" + port}, "probe")
	if code != 0 || out != "relay probe: "+want+": 200 OK\n" {
		t.Fatalf("probe from SERVEZONE_RELAY_ADMIN_LISTEN: exit %d, stdout %q", code, out)
	}
	status = http.StatusServiceUnavailable
	code, out, stderr = runMain(t, nil, "probe", "--admin-listen", "0.0.0.0:"+port)
	if code != 1 || out != "" || stderr != "relay probe: GET "+want+": 503 Service Unavailable\n" {
		t.Fatalf("probe of a failing relay: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	srv.Close()
	if code, _, _ := runMain(t, nil, "probe", "--admin-listen", "127.0.0.1:"+port); code != 1 {
		t.Fatalf("probe of nothing: exit %d, want 1", code)
	}
	if code, _, stderr := runMain(t, nil, "probe", "--admin-listen", "nowhere"); code != 2 ||
		stderr != `relay probe: --admin-listen="nowhere": must be host:port or :port`+"\n" {
		t.Fatalf("probe of a bad address: exit %d, stderr %q", code, stderr)
	}
}

// The Dockerfile pins every base image by digest and health-checks with `relay probe` (exec form:
// the image has no shell).
func TestDockerfilePinsBasesAndProbes(t *testing.T) {
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	froms := regexp.MustCompile(`(?m)^FROM (\S+)`).FindAllStringSubmatch(string(b), -1)
	if len(froms) < 2 {
		t.Fatalf("Dockerfile has %d FROM lines", len(froms))
	}
	for _, f := range froms {
		if !regexp.MustCompile(`^[^@\s]+:[^@\s]+@sha256:[0-9a-f]{64}$`).MatchString(f[1]) {
			t.Errorf("base image %s is not pinned by tag@sha256:digest", f[1])
		}
	}
	if !regexp.MustCompile(`(?m)^HEALTHCHECK .*CMD \["/relay", "probe"\]$`).Match(b) {
		t.Errorf("Dockerfile has no HEALTHCHECK running [\"/relay\", \"probe\"]")
	}
}
