package registry_test

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// An operator who empties the cache directory of a running relay (rm -rf cache/*) to free disk
// costs it the stored objects and, for a pause, fills: not the cache for good.
func TestCacheRecoversFromAnEmptiedDirectory(t *testing.T) {
	if testing.Short() {
		t.Skip("may wait out the cache's one-minute pause after a disk error")
	}
	up := newTestUpstream(t, testUsers)
	e := startRelay(t, up.URL(), "", nil)
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
		time.Sleep(61 * time.Second) // the pause
		get(layers[1].String())
	}
	if _, err := os.Stat(blobPath(e.cacheDir, layers[1].String())); err != nil {
		t.Fatalf("a minute after its directory was emptied the cache still stores nothing: %v (fill failures: disk %v, bypass disk %v)",
			err, e.Metric("relay_registry_cache_fill_failures_total", "reason", "disk"), e.Metric("relay_registry_cache_bypass_total", "reason", "disk"))
	}
}
