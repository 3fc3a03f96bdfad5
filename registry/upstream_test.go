package registry_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
)

// testUpstream is a real OCI registry (go-containerregistry's pkg/registry, in memory) behind a
// token-auth front end of the kind Docker Hub and most registries run: a request without a valid
// Bearer token gets 401 with a Bearer challenge whose realm is the upstream's own /token; a
// token whose user may not touch the repository gets 403 DENIED. It counts what the registry
// really served, and can corrupt, slow or hold blob bodies.
type testUpstream struct {
	srv *httptest.Server

	users map[string]testUser // set at construction

	mu     sync.Mutex
	tokens map[string]string // guarded by mu: token → user

	blobGets      atomic.Int64 // GET /v2/…/blobs/… answered 2xx by the registry
	blobBytes     atomic.Int64 // body bytes of those answers
	manifestGets  atomic.Int64 // GET /v2/…/manifests/… answered 2xx
	heads         atomic.Int64 // HEAD requests that passed authorization
	inflight      atomic.Int64 // requests whose handler is running: an upstream connection held
	refused       atomic.Int64 // requests answered 401 or 403
	corrupt       sync.Map     // digest → true: flip a byte of the body
	bytesPerSec   atomic.Int64 // 0: unthrottled
	holds         sync.Map     // digest → chan struct{}: a GET of the blob pauses after its first chunk until it is closed
	sendBuffer    atomic.Int64 // SO_SNDBUF of connections accepted from now on; 0: the kernel's (autotuned)
	sawAuthHeader sync.Map     // every Authorization value the registry received → true
}

type testUser struct {
	password string
	pull     []string // repositories the user may pull
	push     []string // repositories the user may push
}

const testService = "test-registry"

func newTestUpstream(t testing.TB, users map[string]testUser) *testUpstream {
	u := &testUpstream{users: users, tokens: map[string]string{}}
	reg := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	mux := http.NewServeMux()
	mux.HandleFunc("/token", u.token)
	mux.Handle("/v2/", u.guard(reg))
	u.srv = httptest.NewUnstartedServer(mux)
	u.srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if n := u.sendBuffer.Load(); s == http.StateNew && n > 0 {
			c.(*net.TCPConn).SetWriteBuffer(int(n))
		}
	}
	u.srv.Start()
	t.Cleanup(u.srv.Close)
	return u
}

// hold makes every GET of the blob digest pause after its first chunk (32 KiB, flushed: the relay
// has it) until release is called, so that a test can act while a fill of it is in progress
// however slowly the machine runs. It is released at the end of the test at the latest.
func (u *testUpstream) hold(t testing.TB, digest string) (release func()) {
	gate := make(chan struct{})
	u.holds.Store(digest, gate)
	var once sync.Once
	release = func() {
		once.Do(func() {
			u.holds.Delete(digest)
			close(gate)
		})
	}
	t.Cleanup(release)
	return release
}

func (u *testUpstream) URL() string  { return u.srv.URL }
func (u *testUpstream) Host() string { return strings.TrimPrefix(u.srv.URL, "http://") }

// token is the token endpoint: Basic credentials in, an opaque Bearer token out. Anonymous
// callers get a token too (one that may do nothing), as public registries hand out.
func (u *testUpstream) token(w http.ResponseWriter, r *http.Request) {
	user := ""
	if name, pw, ok := r.BasicAuth(); ok {
		if tu, ok := u.users[name]; !ok || tu.password != pw {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		user = name
	}
	var b [16]byte
	rand.Read(b[:])
	tok := "tok-" + hex.EncodeToString(b[:])
	u.mu.Lock()
	u.tokens[tok] = user
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"token": tok, "access_token": tok, "expires_in": 3600})
}

// challenge is the exact WWW-Authenticate the upstream sends for a repository.
func (u *testUpstream) challenge(repo string) string {
	// The realm names the token server by host name: ggcr refuses a token realm on a loopback
	// IP literal other than the registry's own host:port.
	realm := strings.Replace(u.srv.URL, "127.0.0.1", "localhost", 1) + "/token"
	c := fmt.Sprintf(`Bearer realm="%s",service="%s"`, realm, testService)
	if repo != "" {
		c += fmt.Sprintf(`,scope="repository:%s:pull"`, repo)
	}
	return c
}

// repoOf reads the repository of a /v2/<name>/(blobs|manifests|tags)/… path.
func repoOf(path string) string {
	rest := strings.TrimPrefix(path, "/v2/")
	for _, kw := range []string{"/blobs/", "/manifests/", "/tags/"} {
		if i := strings.LastIndex(rest, kw); i > 0 {
			return rest[:i]
		}
	}
	return ""
}

func (u *testUpstream) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.inflight.Add(1)
		defer u.inflight.Add(-1)
		if a := r.Header.Get("Authorization"); a != "" {
			u.sawAuthHeader.Store(a, true)
		}
		repo := repoOf(r.URL.Path)
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		u.mu.Lock()
		user, ok := u.tokens[tok]
		u.mu.Unlock()
		if !ok {
			u.refused.Add(1)
			w.Header().Set("WWW-Authenticate", u.challenge(repo))
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
		if repo != "" {
			allowed := u.users[user].pull
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				allowed = u.users[user].push
			}
			if !contains(allowed, repo) {
				u.refused.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusForbidden)
				fmt.Fprint(w, `{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}`)
				return
			}
		}
		if r.Method == http.MethodHead {
			u.heads.Add(1)
		}
		cw := &countingUpstreamWriter{ResponseWriter: w, u: u, ctx: r.Context()}
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
			cw.blob = true
			d := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
			_, cw.corrupt = u.corrupt.Load(d)
			if gate, ok := u.holds.Load(d); ok {
				cw.hold = gate.(chan struct{})
			}
		}
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
			cw.manifest = true
		}
		next.ServeHTTP(cw, r)
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// countingUpstreamWriter counts, corrupts, paces and holds what the registry writes.
type countingUpstreamWriter struct {
	http.ResponseWriter
	u                      *testUpstream
	ctx                    context.Context // the request's
	blob, manifest         bool
	corrupt, flipped, okay bool
	hold                   chan struct{} // non-nil: pause after the next chunk until it is closed
}

func (c *countingUpstreamWriter) WriteHeader(code int) {
	if code >= 200 && code < 300 {
		c.okay = true
		if c.blob {
			c.u.blobGets.Add(1)
		}
		if c.manifest {
			c.u.manifestGets.Add(1)
		}
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *countingUpstreamWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		chunk := p
		if len(chunk) > 32<<10 {
			chunk = chunk[:32<<10]
		}
		if c.blob && c.corrupt && !c.flipped && len(chunk) > 0 {
			cp := append([]byte(nil), chunk...)
			cp[len(cp)/2] ^= 0xff
			chunk, c.flipped = cp, true
		}
		n, err := c.ResponseWriter.Write(chunk)
		written += n
		if c.blob && c.okay {
			c.u.blobBytes.Add(int64(n))
		}
		if err != nil {
			return written, err
		}
		if bps := c.u.bytesPerSec.Load(); bps > 0 {
			if f, ok := c.ResponseWriter.(http.Flusher); ok {
				f.Flush()
			}
			time.Sleep(time.Duration(int64(n) * int64(time.Second) / bps)) // the upstream's rate: the wait is the behaviour
		}
		if c.blob && c.okay && c.hold != nil {
			if f, ok := c.ResponseWriter.(http.Flusher); ok {
				f.Flush()
			}
			select {
			case <-c.hold:
			case <-c.ctx.Done():
				return written, c.ctx.Err()
			}
			c.hold = nil
		}
		p = p[n:]
	}
	return written, nil
}

func (c *countingUpstreamWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
