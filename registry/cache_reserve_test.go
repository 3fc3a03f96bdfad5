package registry_test

import (
	"net/http"
	"os"
	"testing"

	"code.foss.global/serve.zone/relay/registry"
)

// A fill that cannot have room (fills in progress hold it) is served uncached; it must not
// evict stored objects on its way to finding that out.
func TestFillThatCannotReserveEvictsNothing(t *testing.T) {
	up := newTestUpstream(t, testUsers)
	e := startRelay(t, up.URL(), "", func(o *registry.Options) { o.CacheMaxBytes = 700 << 10 })
	small := layerDigests(t, pushImage(t, up, "team/app", 150<<10, 1))[0].String()
	big := layerDigests(t, pushImage(t, up, "team/app", 400<<10, 2))
	tok := up.tokenFor(t, "alice", "alice-secret-pw")
	get := func(digest string) {
		resp, body, err := rawGet(t, e, http.MethodGet, "/v2/team/app/blobs/"+digest, tok, nil)
		if err != nil || resp.StatusCode != http.StatusOK || sha256Of(body) != digest {
			t.Errorf("GET %s: %v %v", digest, resp.StatusCode, err)
		}
	}

	get(small) // stored: about 150 KiB of the 700 KiB bound
	e.settle()
	if _, err := os.Stat(blobPath(e.cacheDir, small)); err != nil {
		t.Fatal(err)
	}

	// A slow fill of one big layer reserves about 400 KiB; a second big layer cannot fit beside
	// it even in an empty cache, so it is served uncached.
	up.bytesPerSec.Store(400 << 10)
	done := make(chan struct{})
	go func() { defer close(done); get(big[0].String()) }()
	e.Eventually("the first big fill runs", func() bool { return e.Metric("relay_registry_cache_fills_in_flight") == 1 })
	get(big[1].String())
	<-done
	e.settle()

	if got := e.Metric("relay_registry_cache_bypass_total", "reason", "too-large"); got != 1 {
		t.Fatalf("too-large bypasses = %v, want 1 (the second big layer)", got)
	}
	if _, err := os.Stat(blobPath(e.cacheDir, small)); err != nil {
		t.Fatalf("a stored object was evicted for a fill that then went uncached: %v (evictions %v)",
			err, e.Metric("relay_registry_cache_evictions_total"))
	}
}
