package registry_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/registry"
)

// cachedLayer pushes a one-layer image, pulls the layer through the relay as alice and returns
// its path, digest, bytes and alice's token.
func cachedLayer(t *testing.T, up *testUpstream, e *relayEnv, size int64) (path, digest string, blob []byte, tok string) {
	t.Helper()
	img := pushImage(t, up, "team/app", size, 1)
	digest = layerDigests(t, img)[0].String()
	path = "/v2/team/app/blobs/" + digest
	tok = up.tokenFor(t, "alice", "alice-secret-pw")
	resp, blob, err := rawGet(t, e, http.MethodGet, path, tok, nil)
	if err != nil || resp.StatusCode != http.StatusOK || sha256Of(blob) != digest {
		t.Fatalf("fill: %v %v", resp.StatusCode, err)
	}
	e.settle()
	return path, digest, blob, tok
}

func TestRangeOnACachedBlobIsServedFromTheCacheAfterAuthorization(t *testing.T) {
	up := newTestUpstream(t, testUsers)
	e := startRelay(t, up.URL(), "", nil)
	path, _, blob, tok := cachedLayer(t, up, e, 64<<10)
	gets, heads := up.blobGets.Load(), up.heads.Load()

	resp, body, err := rawGet(t, e, http.MethodGet, path, tok, map[string]string{"Range": "bytes=100-1123"})
	if err != nil || resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, blob[100:1124]) {
		t.Fatalf("range: %v %v, %d bytes", resp.StatusCode, err, len(body))
	}
	if cr := resp.Header.Get("Content-Range"); cr != fmt.Sprintf("bytes 100-1123/%d", len(blob)) {
		t.Fatalf("Content-Range %q", cr)
	}
	if up.blobGets.Load() != gets || up.heads.Load() != heads+1 {
		t.Fatalf("range on a cached blob: upstream GETs %d→%d, HEADs %d→%d; want no GET and one HEAD",
			gets, up.blobGets.Load(), heads, up.heads.Load())
	}
}

func TestHeadAndUncachedRangeAreForwarded(t *testing.T) {
	up := newTestUpstream(t, testUsers)
	e := startRelay(t, up.URL(), "", nil)
	img := pushImage(t, up, "team/app", 64<<10, 1)
	digest := layerDigests(t, img)[0].String()
	path := "/v2/team/app/blobs/" + digest
	tok := up.tokenFor(t, "alice", "alice-secret-pw")

	heads := up.heads.Load()
	resp, body, err := rawGet(t, e, http.MethodHead, path, tok, nil)
	if err != nil || resp.StatusCode != http.StatusOK || len(body) != 0 || resp.Header.Get("Docker-Content-Digest") != digest {
		t.Fatalf("HEAD: %v %v %q", resp.StatusCode, err, resp.Header.Get("Docker-Content-Digest"))
	}
	if resp.ContentLength <= 0 || up.heads.Load() != heads+1 {
		t.Fatalf("HEAD: Content-Length %d, upstream HEADs +%d", resp.ContentLength, up.heads.Load()-heads)
	}
	resp, body, err = rawGet(t, e, http.MethodGet, path, tok, map[string]string{"Range": "bytes=0-9"})
	if err != nil || resp.StatusCode != http.StatusPartialContent || len(body) != 10 {
		t.Fatalf("uncached range: %v %v, %d bytes", resp.StatusCode, err, len(body))
	}
	e.settle()
	if _, err := os.Stat(blobPath(e.cacheDir, digest)); !os.IsNotExist(err) {
		t.Fatal("a Range answer was cached")
	}
	if got := e.Metric("relay_registry_cache_objects"); got != 0 {
		t.Fatalf("%v objects cached by HEAD and Range", got)
	}
}

func TestTagsAndOtherAlgorithmsAreNeverCached(t *testing.T) {
	up := newTestUpstream(t, testUsers)
	e := startRelay(t, up.URL(), "", nil)
	pushImage(t, up, "team/app", 16<<10, 1)
	tok := up.tokenFor(t, "alice", "alice-secret-pw")
	up.manifestGets.Store(0)
	for range 2 {
		resp, _, err := rawGet(t, e, http.MethodGet, "/v2/team/app/manifests/v1", tok,
			map[string]string{"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("tag: %v %v", resp.StatusCode, err)
		}
	}
	if got := up.manifestGets.Load(); got != 2 {
		t.Fatalf("two GETs of a tag reached the upstream %d times, want 2", got)
	}
	sha512 := "sha512:" + strings.Repeat("ab", 64)
	resp, _, err := rawGet(t, e, http.MethodGet, "/v2/team/app/blobs/"+sha512, tok, nil)
	if err != nil || resp.StatusCode == http.StatusOK {
		t.Fatalf("sha512 blob: %v %v", resp.StatusCode, err)
	}
	e.settle()
	if got := e.Metric("relay_registry_cache_objects"); got != 0 {
		t.Fatalf("%v objects cached from tags and sha512", got)
	}
	if got := e.Metric("relay_registry_cache_misses_total", "kind", "blob") + e.Metric("relay_registry_cache_misses_total", "kind", "manifest"); got != 0 {
		t.Fatalf("tags or sha512 went through the cache (%v misses)", got)
	}
}

func TestPathsTheRelayDidNotJudgeAreNotForwarded(t *testing.T) {
	var seen atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen.Add(1) }))
	defer up.Close()
	e := startRelay(t, up.URL, "", nil)
	for _, p := range []string{"/v2/team/../../admin", "/v2//etc", "/v2/a/./b", "/v2/a%2Fb/manifests/x"} {
		resp, body, err := rawGet(t, e, http.MethodGet, p, "", nil)
		if err != nil || resp.StatusCode != http.StatusBadRequest || !bytes.Contains(body, []byte("registry-path-invalid")) {
			t.Errorf("%s: %v %v %q", p, resp.StatusCode, err, body)
		}
	}
	if seen.Load() != 0 {
		t.Fatalf("the upstream received %d requests for unjudged paths", seen.Load())
	}
}

func TestCacheSurvivesARelayRestart(t *testing.T) {
	up := newTestUpstream(t, testUsers)
	cacheDir := filepath.Join(t.TempDir(), "cache")
	e := startRelay(t, up.URL(), cacheDir, nil)
	img := pushImage(t, up, "team/app", 64<<10, 2)
	if err := pullImage(t, e, newClient(t, "alice", "alice-secret-pw"), "team/app", img); err != nil {
		t.Fatal(err)
	}
	e.settle()
	e.Close()

	e2 := startRelay(t, up.URL(), cacheDir, nil)
	up.blobGets.Store(0)
	if err := pullImage(t, e2, newClient(t, "bob", "bob-secret-pw"), "team/app", img); err != nil {
		t.Fatal(err)
	}
	if got := up.blobGets.Load(); got != 0 {
		t.Fatalf("after a restart the pull fetched %d blobs from upstream, want 0", got)
	}
}

// stallingUpstream answers one blob with its headers and half its bytes, then goes silent until
// released.
func stallingUpstream(t *testing.T, blob []byte) (*httptest.Server, string) {
	release := make(chan struct{})
	digest := sha256Of(blob)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
		w.Header().Set("Docker-Content-Digest", digest)
		if r.Method == http.MethodHead {
			return
		}
		w.Write(blob[:len(blob)/2])
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	return srv, digest
}

func TestStalledFillIsNotPublishedAndCutsItsCallersShort(t *testing.T) {
	blob := make([]byte, 256<<10)
	rand.Read(blob)
	srv, digest := stallingUpstream(t, blob)
	e := startRelay(t, srv.URL, "", func(o *registry.Options) { o.StallTimeout = 300 * time.Millisecond })
	start := time.Now()
	_, body, err := rawGet(t, e, http.MethodGet, "/v2/r/blobs/"+digest, "", nil)
	if err == nil || len(body) >= len(blob) {
		t.Fatalf("stalled fill: %v, %d bytes: %.200q", err, len(body), body)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the stall was noticed after %v", d)
	}
	e.settle()
	if got := e.Metric("relay_registry_cache_fill_failures_total", "reason", "stalled"); got != 1 {
		t.Fatalf("stalled fill failures = %v", got)
	}
	if _, err := os.Stat(blobPath(e.cacheDir, digest)); !os.IsNotExist(err) {
		t.Fatal("a stalled fill was published")
	}
}

// TestFillPassesOnWhatArrivedWhileTheUpstreamPauses: a fill wakes its callers in batches, but
// bytes short of a batch must not wait for the next ones: an upstream that sends half a blob and
// pauses has its half at the caller while it pauses. (Before, they waited for 256 KiB more or for
// the stall: a caller saw a refusal where it could have had the bytes.)
func TestFillPassesOnWhatArrivedWhileTheUpstreamPauses(t *testing.T) {
	blob := make([]byte, 256<<10)
	rand.Read(blob)
	srv, digest := stallingUpstream(t, blob) // half the blob, then silence until the test ends
	e := startRelay(t, srv.URL, "", func(o *registry.Options) { o.StallTimeout = 20 * time.Second })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.addr+"/v2/r/blobs/"+digest, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := make(chan int, 1)
	go func() {
		n, _ := io.ReadFull(resp.Body, make([]byte, len(blob)/2))
		got <- n
	}()
	select {
	case n := <-got:
		if n != len(blob)/2 {
			t.Fatalf("the caller had %d of the %d bytes the upstream sent", n, len(blob)/2)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the bytes the upstream sent before pausing did not reach the caller while it paused")
	}
}

// TestCloseEndsFillsInProgress: Close ends every fill in progress, and its callers get no whole
// answer. Each case waits for its moment (the caller's first bytes; the upstream holding the
// request) before Close: when Close raced the fill, a fill that failed before its leader opened
// it left the leader forwarding to this silent upstream, and the test waited out the client's
// 30 s timeout.
func TestCloseEndsFillsInProgress(t *testing.T) {
	t.Run("a caller reading the fill has its answer cut short", func(t *testing.T) {
		blob := make([]byte, 256<<10)
		rand.Read(blob)
		srv, digest := stallingUpstream(t, blob) // half the blob, then silence
		e := startRelay(t, srv.URL, "", nil)
		tr := &http.Transport{DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Get("http://" + e.addr + "/v2/r/blobs/" + digest)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(blob)) {
			t.Fatalf("the fill's answer: %d, Content-Length %d", resp.StatusCode, resp.ContentLength)
		}
		if _, err := io.ReadFull(resp.Body, make([]byte, 1)); err != nil {
			t.Fatalf("the fill's first byte: %v", err)
		}
		e.reg.Close() // returns once the fill has ended
		n, err := io.Copy(io.Discard, resp.Body)
		if err != io.ErrUnexpectedEOF || 1+n >= int64(len(blob)) {
			t.Fatalf("a caller of a fill ended by Close: %v after %d of %d bytes, want the answer cut short", err, 1+n, len(blob))
		}
		if got := e.Metric("relay_registry_cache_fill_failures_total", "reason", "closed"); got != 1 {
			t.Fatalf("closed fill failures = %v", got)
		}
	})
	t.Run("a fill closed before the upstream's head answers 502", func(t *testing.T) {
		digest := "sha256:" + strings.Repeat("ab", 32)
		asked := make(chan struct{}, 1)
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			asked <- struct{}{}
			<-r.Context().Done() // no head until the relay gives up on the request
		}))
		t.Cleanup(up.Close)
		e := startRelay(t, up.URL, "", nil)
		type answer struct {
			status int
			body   []byte
			err    error
		}
		answered := make(chan answer, 1)
		go func() {
			var a answer
			var resp *http.Response
			if resp, a.body, a.err = rawGet(t, e, http.MethodGet, "/v2/r/blobs/"+digest, "", nil); resp != nil {
				a.status = resp.StatusCode
			}
			answered <- a
		}()
		<-asked
		e.reg.Close()
		if a := <-answered; a.err != nil || a.status != http.StatusBadGateway || !bytes.Contains(a.body, []byte(registry.RegistryUpstreamUnreachable)) {
			t.Fatalf("a caller of a fill closed before the upstream's head: %d %v %q, want 502 %s", a.status, a.err, a.body, registry.RegistryUpstreamUnreachable)
		}
		if got := e.Metric("relay_registry_cache_fill_failures_total", "reason", "closed"); got != 1 {
			t.Fatalf("closed fill failures = %v", got)
		}
	})
}

// An empty object cannot have a last byte held back: it is verified before its head is sent.
func TestEmptyObjectIsVerifiedBeforeItsHead(t *testing.T) {
	empty := sha256Of(nil)
	wrong := "sha256:" + strings.Repeat("0", 64)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "0") // the same empty body for every digest
	}))
	defer up.Close()
	e := startRelay(t, up.URL, "", nil)
	resp, body, err := rawGet(t, e, http.MethodGet, "/v2/r/blobs/"+empty, "", nil)
	if err != nil || resp.StatusCode != http.StatusOK || len(body) != 0 {
		t.Fatalf("empty blob: %v %v", resp.StatusCode, err)
	}
	resp, body, err = rawGet(t, e, http.MethodGet, "/v2/r/blobs/"+wrong, "", nil)
	if err != nil || resp.StatusCode != http.StatusBadGateway || !bytes.Contains(body, []byte("registry-digest-mismatch")) {
		t.Fatalf("empty body for a non-empty digest: %v %v %q", resp.StatusCode, err, body)
	}
	e.settle()
	if _, err := os.Stat(blobPath(e.cacheDir, empty)); err != nil {
		t.Fatalf("empty blob not published: %v", err)
	}
	if _, err := os.Stat(blobPath(e.cacheDir, wrong)); !os.IsNotExist(err) {
		t.Fatal("an empty body published under a non-empty digest")
	}
}

// TestCacheDisk: a cache directory that cannot be written is served around, uncached and
// counted, and comes back once it can be written again.
func TestCacheDisk(t *testing.T) {
	t.Run("an unusable directory is served uncached and counted", func(t *testing.T) {
		up := newTestUpstream(t, testUsers)
		notDir := filepath.Join(t.TempDir(), "cache")
		os.WriteFile(notDir, []byte("a file, not a directory"), 0o600)
		e := startRelay(t, up.URL(), notDir, nil)
		img := pushImage(t, up, "team/app", 32<<10, 2)
		if err := pullImage(t, e, newClient(t, "alice", "alice-secret-pw"), "team/app", img); err != nil {
			t.Fatalf("pull without a usable cache: %v", err)
		}
		if got := e.Metric("relay_registry_cache_bypass_total", "reason", "disk"); got < 3 {
			t.Fatalf("bypass{disk} = %v, want every GET by digest counted", got)
		}

		// A cache whose temporary directory disappears mid-run pauses and serves uncached.
		up2 := newTestUpstream(t, testUsers)
		e2 := startRelay(t, up2.URL(), "", nil)
		img2 := pushImage(t, up2, "team/app", 32<<10, 2)
		tmp := filepath.Join(e2.cacheDir, "tmp")
		os.RemoveAll(tmp)
		os.WriteFile(tmp, nil, 0o600)
		if err := pullImage(t, e2, newClient(t, "alice", "alice-secret-pw"), "team/app", img2); err != nil {
			t.Fatalf("pull with a broken cache: %v", err)
		}
		e2.settle()
		if got := e2.Metric("relay_registry_cache_bypass_total", "reason", "disk"); got < 1 {
			t.Fatalf("bypass{disk} = %v after the temporary directory broke", got)
		}
		if got := e2.Metric("relay_registry_cache_objects"); got != 0 {
			t.Fatalf("%v objects cached on a broken disk", got)
		}
	})
	// An operator who empties the cache directory of a running relay (rm -rf cache/*) to free disk
	// costs it the stored objects and, for a pause, fills: not the cache for good.
	t.Run("an emptied directory comes back after its pause", func(t *testing.T) {
		up := newTestUpstream(t, testUsers)
		var skew atomic.Int64 // how far the registry's clock is ahead of the wall clock
		e := startRelay(t, up.URL(), "", func(o *registry.Options) {
			registry.Clock(o, func() time.Time { return time.Now().Add(time.Duration(skew.Load())) })
		})
		img := pushImage(t, up, "team/app", 32<<10, 2)
		layers := layerDigests(t, img)
		tok := up.tokenFor(t, "alice", "alice-secret-pw")
		get := func(digest string) {
			t.Helper()
			resp, body, err := rawGet(t, e, http.MethodGet, "/v2/team/app/blobs/"+digest, tok, nil)
			if err != nil || resp.StatusCode != http.StatusOK || sha256Of(body) != digest {
				t.Fatalf("GET %s: %v %v", digest, resp.StatusCode, err)
			}
			e.settle()
		}
		get(layers[0].String())

		entries, err := os.ReadDir(e.cacheDir)
		if err != nil {
			t.Fatal(err)
		}
		for _, de := range entries {
			if err := os.RemoveAll(filepath.Join(e.cacheDir, de.Name())); err != nil {
				t.Fatal(err)
			}
		}
		get(layers[1].String()) // may fail to cache and pause the cache: a disk error
		if _, err := os.Stat(blobPath(e.cacheDir, layers[1].String())); err != nil {
			skew.Add(int64(61 * time.Second)) // past the pause
			get(layers[1].String())
		}
		if _, err := os.Stat(blobPath(e.cacheDir, layers[1].String())); err != nil {
			t.Fatalf("a minute after its directory was emptied the cache still stores nothing: %v (fill failures: disk %v, bypass disk %v)",
				err, e.Metric("relay_registry_cache_fill_failures_total", "reason", "disk"), e.Metric("relay_registry_cache_bypass_total", "reason", "disk"))
		}
	})
}

// TestCacheBound: the cache stays within its bound, evicting the least recently used objects,
// and evicts nothing for a fill that could not have the room anyway. A bound of 175 KiB and
// layers of 40-100 KiB show it as well as megabytes would: only the sizes' ratios matter.
func TestCacheBound(t *testing.T) {
	t.Run("least recently used objects are evicted", func(t *testing.T) {
		up := newTestUpstream(t, testUsers)
		e := startRelay(t, up.URL(), "", func(o *registry.Options) { o.CacheMaxBytes = 175 << 10 })
		img := pushImage(t, up, "team/app", 64<<10, 4) // about 260 KiB of layers
		tok := up.tokenFor(t, "alice", "alice-secret-pw")
		// One layer at a time, each published before the next: a fill's caller has its last byte
		// before the fill is synced and published, and two fills still reserving 128 KiB would
		// leave the next no room to evict for (too-large, not an eviction).
		for _, d := range layerDigests(t, img) {
			resp, body, err := rawGet(t, e, http.MethodGet, "/v2/team/app/blobs/"+d.String(), tok, nil)
			if err != nil || resp.StatusCode != http.StatusOK || sha256Of(body) != d.String() {
				t.Fatalf("GET %s: %v %v", d, resp.StatusCode, err)
			}
			e.settle()
		}
		if got := e.Metric("relay_registry_cache_evictions_total"); got < 1 {
			t.Fatalf("evictions = %v, want some", got)
		}
		if got := e.Metric("relay_registry_cache_bytes"); got > 175<<10 {
			t.Fatalf("cache holds %v bytes, bound %d", got, 175<<10)
		}
	})
	// A fill that cannot have room (fills in progress hold it) is served uncached; it must not
	// evict stored objects on its way to finding that out.
	t.Run("a fill that cannot reserve evicts nothing", func(t *testing.T) {
		up := newTestUpstream(t, testUsers)
		e := startRelay(t, up.URL(), "", func(o *registry.Options) { o.CacheMaxBytes = 175 << 10 })
		small := layerDigests(t, pushImage(t, up, "team/app", 40<<10, 1))[0].String()
		big := layerDigests(t, pushImage(t, up, "team/app", 100<<10, 2))
		tok := up.tokenFor(t, "alice", "alice-secret-pw")
		get := func(digest string) {
			resp, body, err := rawGet(t, e, http.MethodGet, "/v2/team/app/blobs/"+digest, tok, nil)
			if err != nil || resp.StatusCode != http.StatusOK || sha256Of(body) != digest {
				t.Errorf("GET %s: %v %v", digest, resp.StatusCode, err)
			}
		}

		get(small) // stored: about 40 KiB of the 175 KiB bound
		e.settle()
		if _, err := os.Stat(blobPath(e.cacheDir, small)); err != nil {
			t.Fatal(err)
		}

		// A fill of one big layer, held by the upstream until the second is served, reserves about
		// 100 KiB; a second big layer cannot fit beside it even in an empty cache, so it is served
		// uncached.
		release := up.hold(t, big[0].String())
		done := make(chan struct{})
		go func() { defer close(done); get(big[0].String()) }()
		e.Eventually("the first big fill runs", func() bool { return e.Metric("relay_registry_cache_fills_in_flight") == 1 })
		get(big[1].String())
		release()
		<-done
		e.settle()

		if got := e.Metric("relay_registry_cache_bypass_total", "reason", "too-large"); got != 1 {
			t.Fatalf("too-large bypasses = %v, want 1 (the second big layer)", got)
		}
		if _, err := os.Stat(blobPath(e.cacheDir, small)); err != nil {
			t.Fatalf("a stored object was evicted for a fill that then went uncached: %v (evictions %v)",
				err, e.Metric("relay_registry_cache_evictions_total"))
		}
	})
}

// TestCallerLifetime: what a caller's departure ends and what it does not. Parallel: its cases
// mostly wait for progress timeouts, and share nothing with other tests.
func TestCallerLifetime(t *testing.T) {
	t.Parallel()
	// The upstream holds the blob after its first 32 KiB until the leader's handler has returned,
	// so the leader leaves while the fill is in progress, however slowly the machine runs.
	t.Run("a fill outlives a leader who leaves", func(t *testing.T) {
		up := newTestUpstream(t, testUsers)
		e := startRelay(t, up.URL(), "", nil)
		img := pushImage(t, up, "team/app", 256<<10, 1)
		digest := layerDigests(t, img)[0].String()
		path := "/v2/team/app/blobs/" + digest
		tok := up.tokenFor(t, "alice", "alice-secret-pw")
		up.blobGets.Store(0)
		release := up.hold(t, digest)

		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.addr+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(resp.Body, make([]byte, 16<<10)); err != nil {
			t.Fatalf("the leader's first bytes: %v", err)
		}
		cancel() // the leader leaves early
		resp.Body.Close()
		e.Eventually("the leader's handler returned", func() bool { return strings.Contains(e.Logs.String(), `"outcome":"fill"`) })
		if _, err := os.Stat(blobPath(e.cacheDir, digest)); !os.IsNotExist(err) {
			t.Fatalf("the object was published before the upstream sent it all (%v)", err)
		}
		release()
		e.settle()
		if _, err := os.Stat(blobPath(e.cacheDir, digest)); err != nil {
			t.Fatalf("the fill stopped with its leader: %v", err)
		}
		resp2, body, err := rawGet(t, e, http.MethodGet, path, tok, nil)
		if err != nil || resp2.StatusCode != http.StatusOK || sha256Of(body) != digest || up.blobGets.Load() != 1 {
			t.Fatalf("after the leader left: %v %v, upstream GETs %d", resp2.StatusCode, err, up.blobGets.Load())
		}
	})
	// A fill whose upstream answer is not cacheable (here: a 200 without a length) is handed to its
	// leader as a plain forward. When that caller leaves, the upstream request must end with it, as
	// it does for every other forwarded request: otherwise a silent upstream holds the handler, its
	// goroutine and an upstream connection until the registry closes.
	t.Run("an uncacheable answer ends when its caller leaves", func(t *testing.T) {
		upstreamGone, release := make(chan struct{}), make(chan struct{})
		digest := "sha256:" + strings.Repeat("ab", 32)
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)  // no Content-Length: chunked, so not cacheable
			w.Write(make([]byte, 64<<10)) // more than the relay buffers
			w.(http.Flusher).Flush()
			select { // silent until the relay gives up on the request
			case <-r.Context().Done():
				close(upstreamGone)
			case <-release:
			}
		}))
		t.Cleanup(up.Close)
		e := startRelay(t, up.URL, "", nil)
		t.Cleanup(func() { close(release) })

		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.addr+"/v2/r/blobs/"+digest, nil)
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		io.ReadFull(resp.Body, make([]byte, 4))
		cancel() // the caller leaves
		resp.Body.Close()

		select {
		case <-upstreamGone:
		case <-time.After(5 * time.Second):
			t.Fatal("the caller left 5s ago, but the relay still holds its upstream request open")
		}
	})

	// A /v2/ caller that stops reading held its handler for ever, and with
	// it an upstream connection, a stored object's file (evicted or not) or a fill's. Every write
	// to a caller, and every read of its body, must now complete within the progress timeout.
	// The caller here is a raw connection that sends its request and never reads (or, uploading,
	// stops sending) through narrowDialer, so the relay's writes block once the socket buffers,
	// tens of KiB, are full.
	const progress = 300 * time.Millisecond
	stalled := func(t *testing.T, e *relayEnv, request string) {
		t.Helper()
		c, err := narrowDialer("").Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, request); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("a forwarded answer ends when its caller stops reading", func(t *testing.T) {
		upstreamGone := make(chan struct{})
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			buf := make([]byte, 64<<10)
			for { // an endless manifest: only the caller's pace stops it
				if _, err := w.Write(buf); err != nil {
					close(upstreamGone)
					return
				}
			}
		}))
		t.Cleanup(up.Close)
		e := startRelay(t, up.URL, "", func(o *registry.Options) { o.ProgressTimeout = progress })
		stalled(t, e, "GET /v2/r/manifests/latest HTTP/1.1\r\nHost: relay\r\n\r\n")
		select {
		case <-upstreamGone:
		case <-time.After(10 * time.Second):
			t.Fatal("10s after its caller stopped reading, the relay still holds the upstream request")
		}
	})
	t.Run("a stored object is let go when its caller stops reading", func(t *testing.T) {
		blob := make([]byte, 2<<20) // well beyond the socket buffers
		rand.Read(blob)
		digest := sha256Of(blob)
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
			w.Header().Set("Docker-Content-Digest", digest)
			if r.Method == http.MethodGet {
				w.Write(blob)
			}
		}))
		t.Cleanup(up.Close)
		// The cache is filled through a relay with the default progress timeout: this test's
		// reader of 2 MiB may itself be starved for 300 ms on a busy machine, and be cut.
		cache := filepath.Join(t.TempDir(), "cache")
		path := "/v2/r/blobs/" + digest
		filler := startRelay(t, up.URL, cache, nil)
		if resp, body, err := rawGet(t, filler, http.MethodGet, path, "", nil); err != nil || resp.StatusCode != http.StatusOK || len(body) != len(blob) {
			t.Fatalf("fill: %v %v", resp.StatusCode, err)
		}
		filler.settle()
		filler.Shutdown()
		e := startRelay(t, up.URL, cache, func(o *registry.Options) { o.ProgressTimeout = progress })
		stalled(t, e, "GET "+path+" HTTP/1.1\r\nHost: relay\r\n\r\n")
		// A hit's handler logs its request once it has closed the object's file, with the bytes
		// the caller's socket took: fewer than the object's, or it was never stalled.
		var line string
		e.Eventually("the stalled hit's handler returned", func() bool {
			for l := range strings.Lines(e.Logs.String()) {
				if strings.Contains(l, `"outcome":"hit"`) {
					line = l
					return true
				}
			}
			return false
		})
		var logged struct{ Bytes int64 }
		if err := json.Unmarshal([]byte(line), &logged); err != nil {
			t.Fatalf("the hit's log line: %v: %s", err, line)
		}
		if logged.Bytes >= int64(len(blob)) {
			t.Fatalf("the stalled caller's socket took all %d bytes: the hit was never stalled", logged.Bytes)
		}
	})
	t.Run("an upload ends when its caller stops sending", func(t *testing.T) {
		bodyEnded := make(chan error, 1)
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, err := io.Copy(io.Discard, r.Body)
			bodyEnded <- err
		}))
		t.Cleanup(up.Close)
		e := startRelay(t, up.URL, "", func(o *registry.Options) { o.ProgressTimeout = progress })
		stalled(t, e, "PUT /v2/r/blobs/uploads/u1 HTTP/1.1\r\nHost: relay\r\nContent-Length: 1048576\r\n\r\n"+
			strings.Repeat("x", 1000))
		select {
		case err := <-bodyEnded:
			if err == nil {
				t.Fatal("the upstream received a whole upload its caller never sent")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("10s after its caller stopped sending, the relay still holds the upload open")
		}
	})
}

// TestUpstreamTransport: how the relay connects to the upstream.
func TestUpstreamTransport(t *testing.T) {
	// The registry transport had no per-host connection cap, so callers
	// the upstream answers slowly each held an upstream connection of their own, without bound.
	// Since the budget fixes (docs/hostile.md) the fetch slots bound them first (the cap is never below the slots: see the
	// next test), and a caller beyond them waits for one.
	t.Run("at most MaxFetches upstream requests at once", func(t *testing.T) {
		const limit, callers = 2, 6
		// Requests in the upstream's handler, not its connections: a caller given the slot a
		// finished one left may dial before that one's connection is back in the idle pool.
		var open, peak atomic.Int64
		release := make(chan struct{})
		up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := open.Add(1)
			defer open.Add(-1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			<-release
			w.Write([]byte("{}"))
		}))
		up.Start()
		t.Cleanup(up.Close)
		var releaseOnce sync.Once
		letGo := func() { releaseOnce.Do(func() { close(release) }) }
		t.Cleanup(letGo) // before up.Close: a failed wait must not leave the upstream's handlers held
		e := startRelay(t, up.URL, "", func(o *registry.Options) { o.MaxFetches, o.MaxFetchesPerSource = limit, limit })
		errs := make(chan error, callers)
		for i := range callers {
			go func() {
				resp, _, err := rawGet(t, e, http.MethodGet, fmt.Sprintf("/v2/r/manifests/t%d", i), "", nil)
				if err == nil && resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
				errs <- err
			}()
		}
		e.Eventually("the upstream holds requests", func() bool { return open.Load() >= limit })
		// Every caller is at the upstream or parked for a slot: none is left to open a connection.
		e.Eventually("the callers beyond the limit wait for a slot", func() bool { return e.reg.FetchWaiters() == callers-limit })
		letGo()
		for range callers {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		if got := peak.Load(); got != limit {
			t.Fatalf("the upstream served %d requests at once, want %d", got, limit)
		}
	})
	// A per-host cap below the slots would make a request that holds its slot wait for a
	// connection, where no metric and no bounded wait sees it.
	t.Run("a connection cap below the slots is refused", func(t *testing.T) {
		_, err := registry.New(registry.Options{Upstream: "https://registry.example", MaxUpstreamConns: 10,
			MaxFetches: 8, MaxAuthorizations: 4})
		if err == nil || !strings.Contains(err.Error(), "MaxUpstreamConns") {
			t.Fatalf("New with a cap of 10 for 12 slots: %v", err)
		}
		reg, err := registry.New(registry.Options{Upstream: "https://registry.example", MaxUpstreamConns: 12,
			MaxFetches: 8, MaxAuthorizations: 4})
		if err != nil {
			t.Fatalf("New with a cap of 12 for 12 slots: %v", err)
		}
		reg.Close()
	})
}
