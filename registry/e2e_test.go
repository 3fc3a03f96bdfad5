package registry_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// The tests here run a real OCI registry (go-containerregistry's pkg/registry, behind a token
// auth front end) on loopback, a real relay (relay.New, its downstream listener, a simulated
// Cloudly) whose /v2/ is this package's handler, and pull with a real client (ggcr remote).

var testUsers = map[string]testUser{
	"alice":   {password: "alice-secret-pw", pull: []string{"team/app"}, push: []string{"team/app"}},
	"bob":     {password: "bob-secret-pw", pull: []string{"team/app"}},
	"mallory": {password: "mallory-secret-pw", pull: []string{"mallory/own"}},
}

func TestPullFillsCacheThenServesItWithoutUpstreamBytes(t *testing.T) {
	up := newTestUpstream(t, testUsers)
	img := pushImage(t, up, "team/app", 256<<10, 3)
	e := startRelay(t, up.URL(), "", nil)
	up.blobGets.Store(0)
	up.blobBytes.Store(0)
	up.manifestGets.Store(0)

	if err := pullImage(t, e, newClient(t, "alice", "alice-secret-pw"), "team/app", img); err != nil {
		t.Fatalf("first pull: %v", err)
	}
	e.settle()
	total := blobBytesOf(t, img)
	if g, b := up.blobGets.Load(), up.blobBytes.Load(); g != 4 || b != total {
		t.Fatalf("first pull: upstream served %d blob GETs, %d bytes; want 4 (3 layers + config), %d", g, b, total)
	}
	if got := e.Metric("relay_registry_cache_objects"); got != 5 {
		t.Fatalf("cache holds %v objects after the first pull, want 5 (manifest, config, 3 layers)", got)
	}
	if got := e.Metric("relay_registry_cache_misses_total", "kind", "blob"); got != 4 {
		t.Fatalf("blob misses = %v, want 4", got)
	}
	for _, d := range layerDigests(t, img) {
		if _, err := os.Stat(blobPath(e.cacheDir, d.String())); err != nil {
			t.Fatalf("layer %s not published: %v", d, err)
		}
	}

	// A second pull of the same digest, by another user with other credentials.
	up.blobGets.Store(0)
	up.blobBytes.Store(0)
	up.manifestGets.Store(0)
	heads := up.heads.Load()
	if err := pullImage(t, e, newClient(t, "bob", "bob-secret-pw"), "team/app", img); err != nil {
		t.Fatalf("second pull: %v", err)
	}
	if g, b, m := up.blobGets.Load(), up.blobBytes.Load(), up.manifestGets.Load(); g != 0 || b != 0 || m != 0 {
		t.Fatalf("second pull read from upstream: %d blob GETs, %d blob bytes, %d manifest GETs; want none", g, b, m)
	}
	if got := up.heads.Load() - heads; got != 5 {
		t.Fatalf("second pull: %d authorization HEADs reached the registry, want 5 (one per object)", got)
	}
	if got := e.Metric("relay_registry_cache_hits_total", "kind", "blob"); got != 4 {
		t.Fatalf("blob hits = %v, want 4", got)
	}
	if got := e.Metric("relay_registry_cache_hits_total", "kind", "manifest"); got != 1 {
		t.Fatalf("manifest hits = %v, want 1", got)
	}
	if got := e.Metric("relay_registry_upstream_authorizations_total", "outcome", "allowed"); got != 5 {
		t.Fatalf("allowed authorizations = %v, want 5", got)
	}
	// A handler counts its bytes as it returns, which may be just after its caller has them all.
	e.Eventually(fmt.Sprintf("at least %d bytes counted from the cache", total), func() bool {
		return e.Metric("relay_registry_bytes_total", "source", "cache") >= float64(total)
	})

	// Nothing secret in the logs, at debug level: no token, no password, no Authorization.
	logs := e.Logs.String()
	if !strings.Contains(logs, `"outcome":"hit"`) {
		t.Fatalf("debug log has no hit line: %s", logs)
	}
	up.sawAuthHeader.Range(func(k, _ any) bool {
		tok := strings.TrimPrefix(k.(string), "Bearer ")
		if strings.Contains(logs, tok) {
			t.Errorf("a token the callers sent appears in the relay's log")
		}
		return true
	})
	for _, u := range testUsers {
		if strings.Contains(logs, u.password) {
			t.Errorf("a password appears in the relay's log")
		}
	}
	if strings.Contains(strings.ToLower(logs), "authorization") || strings.Contains(logs, "Bearer") {
		t.Errorf("the relay's log mentions Authorization or a Bearer value: %s", logs)
	}
}

func TestRefusedCallerGetsTheRefusalEvenForACachedBlob(t *testing.T) {
	up := newTestUpstream(t, testUsers)
	img := pushImage(t, up, "team/app", 128<<10, 2)
	e := startRelay(t, up.URL(), "", nil)
	if err := pullImage(t, e, newClient(t, "alice", "alice-secret-pw"), "team/app", img); err != nil {
		t.Fatal(err)
	}
	e.settle()
	layer := layerDigests(t, img)[0]
	if _, err := os.Stat(blobPath(e.cacheDir, layer.String())); err != nil {
		t.Fatalf("blob not cached: %v", err)
	}
	hits := e.Metric("relay_registry_cache_hits_total", "kind", "blob")
	fromCache := e.Metric("relay_registry_bytes_total", "source", "cache")

	// mallory holds valid credentials for another repository: the registry answers 403 DENIED.
	blobURL := "/v2/team/app/blobs/" + layer.String()
	resp, body, err := rawGet(t, e, http.MethodGet, blobURL, up.tokenFor(t, "mallory", "mallory-secret-pw"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusForbidden || !bytes.Contains(body, []byte(`"DENIED"`)) {
		t.Fatalf("mallory got %d %q, want the registry's 403 DENIED", resp.StatusCode, body)
	}
	// The same with a Range request, which a hit would serve from the file.
	resp, body, err = rawGet(t, e, http.MethodGet, blobURL, up.tokenFor(t, "mallory", "mallory-secret-pw"),
		map[string]string{"Range": "bytes=0-99"})
	if err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("mallory's Range request got %v %v %q, want 403", resp.StatusCode, err, body)
	}
	// No credentials at all: the registry's challenge, untouched.
	resp, body, err = rawGet(t, e, http.MethodGet, blobURL, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") != up.challenge("team/app") ||
		!bytes.Contains(body, []byte(`"UNAUTHORIZED"`)) {
		t.Fatalf("anonymous caller got %d, challenge %q, body %q; want 401 with %q",
			resp.StatusCode, resp.Header.Get("WWW-Authenticate"), body, up.challenge("team/app"))
	}
	// And through a real client library.
	ref, _ := name.NewDigest(e.addr+"/team/app@"+layer.String(), name.Insecure)
	l, err := remote.Layer(ref, newClient(t, "mallory", "mallory-secret-pw").opts...)
	if err == nil {
		var rc io.ReadCloser
		if rc, err = l.Compressed(); err == nil {
			_, err = io.Copy(io.Discard, rc)
			rc.Close()
		}
	}
	var terr *transport.Error
	if !errors.As(err, &terr) || terr.StatusCode != http.StatusForbidden {
		t.Fatalf("ggcr as mallory: %v, want a 403 transport error", err)
	}

	if got := e.Metric("relay_registry_cache_hits_total", "kind", "blob"); got != hits {
		t.Fatalf("refused callers counted as hits: %v → %v", hits, got)
	}
	if got := e.Metric("relay_registry_bytes_total", "source", "cache"); got != fromCache {
		t.Fatalf("refused callers got %v cached bytes", got-fromCache)
	}
	if got := e.Metric("relay_registry_upstream_authorizations_total", "outcome", "refused"); got < 4 {
		t.Fatalf("refused authorizations = %v, want at least 4", got)
	}
}

func TestCorruptedUpstreamBlobIsNeverPublished(t *testing.T) {
	up := newTestUpstream(t, testUsers)
	img := pushImage(t, up, "team/app", 512<<10, 1)
	e := startRelay(t, up.URL(), "", nil)
	layer := layerDigests(t, img)[0]
	up.corrupt.Store(layer.String(), true)
	tok := up.tokenFor(t, "alice", "alice-secret-pw")
	path := "/v2/team/app/blobs/" + layer.String()

	// Slowed, the caller is mid-transfer when the digest fails: its answer is cut short. Fast, the
	// fill may fail before the caller's answer starts: it is refused. Either way, an error.
	up.bytesPerSec.Store(4 << 20)
	for i := range 2 {
		resp, body, err := rawGet(t, e, http.MethodGet, path, tok, nil)
		e.settle()
		switch {
		case err == nil && resp.StatusCode == http.StatusBadGateway && bytes.Contains(body, []byte(`"DIGEST_INVALID"`)):
		case err == nil:
			t.Fatalf("attempt %d: corrupt blob delivered: %d, %d bytes", i, resp.StatusCode, len(body))
		case !errors.Is(err, io.ErrUnexpectedEOF):
			t.Fatalf("attempt %d: %v, want a transfer cut short (unexpected EOF)", i, err)
		case int64(len(body)) >= resp.ContentLength:
			t.Fatalf("attempt %d: got %d of %d bytes: the last byte must be held back", i, len(body), resp.ContentLength)
		}
		up.bytesPerSec.Store(0)
		if _, err := os.Stat(blobPath(e.cacheDir, layer.String())); !os.IsNotExist(err) {
			t.Fatalf("attempt %d: corrupt blob published (%v)", i, err)
		}
	}
	if got := up.blobGets.Load(); got < 2 {
		t.Fatalf("upstream saw %d blob GETs: the second attempt must fetch again, not read a cache", got)
	}
	if got := e.Metric("relay_registry_cache_fill_failures_total", "reason", "digest-mismatch"); got != 2 {
		t.Fatalf("digest-mismatch fill failures = %v, want 2", got)
	}
	if left, _ := os.ReadDir(filepath.Join(e.cacheDir, "tmp")); len(left) != 0 {
		t.Fatalf("temporary files left behind: %v", left)
	}
	// A real client sees an error too.
	if err := pullImage(t, e, newClient(t, "alice", "alice-secret-pw"), "team/app", img); err == nil {
		t.Fatal("ggcr pulled a corrupt image without error")
	}

	// Once the upstream serves the right bytes, they are fetched, verified and published.
	up.corrupt.Delete(layer.String())
	resp, body, err := rawGet(t, e, http.MethodGet, path, tok, nil)
	e.settle()
	if err != nil || resp.StatusCode != http.StatusOK || sha256Of(body) != layer.String() {
		t.Fatalf("after the fix: %v %v, digest %s", resp.StatusCode, err, sha256Of(body))
	}
	if _, err := os.Stat(blobPath(e.cacheDir, layer.String())); err != nil {
		t.Fatalf("good blob not published: %v", err)
	}
}

// TestConcurrentPullsOfOneBlobFetchItOnce: 20 callers pulling one blob at once cost the upstream
// one GET: one caller leads a fill and the other 19 join it. The upstream holds the blob after its
// first 32 KiB until each of the 19 has joined (or, were they not coalesced, sent its own GET), so
// all of them arrive during the fill however slowly the machine runs; a 256 KiB layer is then as
// good as any. Two refused callers pull at the same moment.
func TestConcurrentPullsOfOneBlobFetchItOnce(t *testing.T) {
	up := newTestUpstream(t, testUsers)
	img := pushImage(t, up, "team/app", 256<<10, 1)
	e := startRelay(t, up.URL(), "", nil)
	layer := layerDigests(t, img)[0]
	up.blobGets.Store(0)
	up.blobBytes.Store(0)
	release := up.hold(t, layer.String())
	path := "/v2/team/app/blobs/" + layer.String()
	tokens := map[string]string{
		"alice":   up.tokenFor(t, "alice", "alice-secret-pw"),
		"bob":     up.tokenFor(t, "bob", "bob-secret-pw"),
		"mallory": up.tokenFor(t, "mallory", "mallory-secret-pw"),
	}

	type result struct {
		who    string
		status int
		digest string
		err    error
	}
	var wg sync.WaitGroup
	var answered atomic.Int64 // pullers (not mallory) answered: none is, while the upstream holds the blob, but a refused one
	start := make(chan struct{})
	results := make(chan result, 22)
	for i := range 22 {
		who := []string{"alice", "bob"}[i%2]
		if i >= 20 {
			who = "mallory" // refused callers pull at the same moment
		}
		wg.Go(func() {
			<-start
			resp, body, err := rawGet(t, e, http.MethodGet, path, tokens[who], nil)
			r := result{who: who, err: err}
			if resp != nil {
				r.status, r.digest = resp.StatusCode, sha256Of(body)
			}
			if who != "mallory" {
				answered.Add(1)
			}
			results <- r
		})
	}
	close(start)
	// Each of the 20 pullers is the leader (one upstream GET), a joiner, or, were the pulls not
	// coalesced, the sender of another upstream GET or already answered without the blob.
	e.Eventually("every puller joined the fill, fetched for itself or was answered", func() bool {
		return e.Metric("relay_registry_cache_coalesced_total", "kind", "blob")+float64(up.blobGets.Load()+answered.Load()) >= 20
	})
	release()
	wg.Wait()
	close(results)
	e.settle()
	for r := range results {
		switch {
		case r.who == "mallory" && r.status != http.StatusForbidden:
			t.Errorf("mallory got %d (%v), want 403", r.status, r.err)
		case r.who != "mallory" && (r.err != nil || r.status != http.StatusOK || r.digest != layer.String()):
			t.Errorf("%s got %d %v with digest %s", r.who, r.status, r.err, r.digest)
		}
	}
	size := blobBytesOf(t, img) - mustConfigSize(t, img)
	if g, b := up.blobGets.Load(), up.blobBytes.Load(); g != 1 || b != size {
		t.Fatalf("20 concurrent pulls made %d upstream blob GETs, %d bytes; want 1 and %d", g, b, size)
	}
	misses := e.Metric("relay_registry_cache_misses_total", "kind", "blob")
	joined := e.Metric("relay_registry_cache_coalesced_total", "kind", "blob")
	hits := e.Metric("relay_registry_cache_hits_total", "kind", "blob")
	if misses != 1 || joined != 19 || hits != 0 {
		t.Fatalf("misses %v, coalesced %v, hits %v; want 1 miss and the 19 others joining the fill", misses, joined, hits)
	}
}

func mustConfigSize(t testing.TB, img interface{ RawConfigFile() ([]byte, error) }) int64 {
	b, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return int64(len(b))
}
