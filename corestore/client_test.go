package corestore

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"code.foss.global/serve.zone/relay/contracts"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const grant = "eyJhbGciOiJSUzI1NiJ9.eyJvcCI6InN0YXR1cyIsInJlc3RvcmVJZCI6InIxIn0.c2lnbmF0dXJlLW9mLXRoZS1ncmFudC1ub3QtcmVhbA"

var control = json.RawMessage(`{ "grant" : "` + grant + `", "expectedRevision": 12345678901234567890 }`)

// seen is what a test Corestore received.
type seen struct {
	mu      sync.Mutex
	path    string
	body    []byte
	headers http.Header
}

func (s *seen) record(r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.path, s.body, s.headers = r.URL.Path, b, r.Header.Clone()
	s.mu.Unlock()
}

func newTLSServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshake errors are what some tests cause
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func pool(srv *httptest.Server) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(srv.Certificate())
	return p
}

func newClient(t *testing.T, opts Options) *Client {
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func wantRefusal(t *testing.T, err error, name contracts.RefusalName, text string) {
	t.Helper()
	if !errors.Is(err, name) {
		t.Fatalf("error %v is not %s", err, name)
	}
	if err.Error() != text {
		t.Fatalf("error text\n%q\nwant\n%q", err.Error(), text)
	}
}

func TestCallPostsTheControlByteForByteOverVerifiedTLS(t *testing.T) {
	var s seen
	srv := newTLSServer(t, func(w http.ResponseWriter, r *http.Request) {
		s.record(r)
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		io.WriteString(w, `{"answer":1}`)
	})
	c := newClient(t, Options{RootCAs: pool(srv)})
	body, err := c.Call(context.Background(), srv.URL, "status", control)
	if err != nil || string(body) != `{"answer":1}` {
		t.Fatalf("call: %q %v", body, err)
	}
	if s.path != "/isolated-restore/status" || string(s.body) != string(control) {
		t.Fatalf("Corestore received %s %q", s.path, s.body)
	}
	for k := range s.headers {
		switch k {
		case "Content-Type", "Content-Length", "User-Agent":
		default:
			t.Errorf("the client added header %s", k)
		}
	}
}

// TestRootCAsAreTheOnlyTrust: the pool cmd/relay loads once from --corestore-ca-file is what
// Corestore certificates are verified against.
func TestRootCAsAreTheOnlyTrust(t *testing.T) {
	srv := newTLSServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{}`) })
	if _, err := newClient(t, Options{RootCAs: pool(srv)}).Call(context.Background(), srv.URL, "prepare", control); err != nil {
		t.Fatal(err)
	}
	if _, err := newClient(t, Options{RootCAs: x509.NewCertPool()}).Call(context.Background(), srv.URL, "prepare", control); !errors.Is(err, contracts.RestoreNodeUnreachable) {
		t.Fatalf("a certificate outside the pool: %v", err)
	}
}

func TestUnreachableIsClassified(t *testing.T) {
	srv := newTLSServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{}`) })
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	slow := newTLSServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer plain.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := "https://" + ln.Addr().String()
	ln.Close()

	trusting := newClient(t, Options{RootCAs: pool(srv), Timeout: 300 * time.Millisecond})
	cases := []struct {
		name   string
		c      *Client
		origin string
		want   string
	}{
		{"unknown authority", newClient(t, Options{}), srv.URL,
			"restore-node-unreachable: TLS with Corestore at " + srv.URL + " failed: certificate signed by an unknown authority"},
		{"wrong host name", trusting, "https://localhost:" + strconv.Itoa(port),
			"restore-node-unreachable: TLS with Corestore at https://localhost:" + strconv.Itoa(port) + " failed: certificate is not valid for the origin's host"},
		{"nothing listening", trusting, closed, "restore-node-unreachable: cannot connect to Corestore at " + closed},
		{"no answer in time", newClient(t, Options{RootCAs: pool(slow), Timeout: 300 * time.Millisecond}), slow.URL,
			"restore-node-unreachable: Corestore at " + slow.URL + " did not answer within 300ms"},
		{"not TLS", trusting, "https://" + plain.Listener.Addr().String(),
			"restore-node-unreachable: TLS with Corestore at https://" + plain.Listener.Addr().String() + " failed: the peer does not speak TLS"},
		{"http without plaintext", trusting, plain.URL,
			"restore-node-unreachable: Corestore origin " + plain.URL + " is not a canonical https origin"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.c.Call(context.Background(), c.origin, "status", control)
			wantRefusal(t, err, contracts.RestoreNodeUnreachable, c.want)
		})
	}
	if _, err := newClient(t, Options{AllowHTTP: true}).Call(context.Background(), plain.URL, "status", control); err != nil {
		t.Fatalf("http with plaintext allowed: %v", err)
	}
}

func TestRefusedCarriesCorestoresReasonSanitized(t *testing.T) {
	var mu sync.Mutex
	var status int
	var ctype, answer string
	redirected := false
	srv := newTLSServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/elsewhere" {
			mu.Lock()
			redirected = true
			mu.Unlock()
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if status == http.StatusFound {
			http.Redirect(w, r, "/elsewhere", status)
			return
		}
		w.Header().Set("Content-Type", ctype)
		w.WriteHeader(status)
		io.WriteString(w, answer)
	})
	c := newClient(t, Options{RootCAs: pool(srv), MaxResponseBytes: 64})
	cases := []struct {
		name          string
		status        int
		ctype, answer string
		want          string
	}{
		{"json reason", 409, "application/json", string(contracts.CorestoreRefusalBody("revision-conflict: expected revision 3, node states 4")),
			"restore-node-refused: revision-conflict: expected revision 3, node states 4"},
		{"grant echoed", 403, "application/json", `{"reason":"grant-refused: ` + grant + ` has expired"}`,
			"restore-node-refused: grant-refused: [redacted] has expired"},
		{"text lines", 400, "text/plain; charset=utf-8", "bad\r\ncontrol\x00 here\n",
			"restore-node-refused: bad control here"},
		{"html page", 502, "text/html", "<html>gateway</html>", "restore-node-refused: Corestore answered HTTP 502"},
		{"json without reason", 500, "application/json", `{"code":7}`, "restore-node-refused: Corestore answered HTTP 500"},
		{"long reason", 400, "application/json", `{"reason":"` + strings.Repeat("no ", 200) + `"}`,
			"restore-node-refused: " + strings.TrimSpace(strings.Repeat("no ", 200))[:253] + "…"},
		{"redirect not followed", http.StatusFound, "", "", "restore-node-refused: Corestore answered HTTP 302"},
		{"oversized answer", 200, "application/json", `{"a":"` + strings.Repeat("x", 100) + `"}`,
			"restore-node-refused: Corestore's answer is 108 bytes, over the relay's limit of 64"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			status, ctype, answer = tc.status, tc.ctype, tc.answer
			mu.Unlock()
			_, err := c.Call(context.Background(), srv.URL, "write", control)
			wantRefusal(t, err, contracts.RestoreNodeRefused, tc.want)
			if strings.Contains(err.Error(), grant) || strings.Contains(err.Error(), grant[:40]) {
				t.Fatal("the refusal repeats the grant")
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	if redirected {
		t.Fatal("the client followed a redirect")
	}
}

func TestSanitizeReason(t *testing.T) {
	for in, want := range map[string]string{
		"  a\tb\u2028c  ":                      "a b c",
		"sha256 " + strings.Repeat("ab", 32):   "sha256 [redacted]",
		"short token abcdefghijklmnopqrstuvwx": "short token abcdefghijklmnopqrstuvwx",
		"bad \xff utf8":                        "bad \uFFFD utf8",
		strings.Repeat("é", 200):               strings.Repeat("é", 126) + "…",
	} {
		if got := SanitizeReason(in); got != want {
			t.Errorf("SanitizeReason(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMetricNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv := newTLSServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{}`) })
	c := newClient(t, Options{RootCAs: pool(srv), Registerer: reg, Logger: zerolog.Nop()})
	c.Call(context.Background(), srv.URL, "status", control)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"relay_corestore_requests_total": true, "relay_corestore_request_duration_seconds": true,
		"relay_corestore_sent_bytes_total": true, "relay_corestore_received_bytes_total": true}
	for _, f := range families {
		if !want[f.GetName()] {
			t.Errorf("unexpected metric %s", f.GetName())
		}
		if f.GetType().String() == "COUNTER" && !strings.HasSuffix(f.GetName(), "_total") {
			t.Errorf("counter %s does not end in _total", f.GetName())
		}
		delete(want, f.GetName())
	}
	if len(want) > 0 {
		t.Errorf("missing metrics %v", want)
	}
}
