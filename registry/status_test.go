package registry_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/registry"
)

// TestStatusShowsCacheBytesHitsAndMisses: a miss fills the cache, a second GET of the same digest
// is a hit, and a bound too small for a third object evicts the first; the status follows, and
// never names a digest, the upstream or a credential.
func TestStatusShowsCacheBytesHitsAndMisses(t *testing.T) {
	up := newTestUpstream(t, testUsers)
	e := startRelay(t, up.URL(), "", func(o *registry.Options) { o.CacheMaxBytes = 200 << 10 })
	st := e.status()
	if st.Cache != "on" || st.LimitBytes != 200<<10 || st.UsedBytes != 0 || e.counted("hits") != 0 || e.counted("misses") != 0 {
		t.Fatalf("before any pull: %+v", st)
	}

	path, digest, blob, tok := cachedLayer(t, up, e, 120<<10) // a miss: fetched and stored
	st = e.status()
	if e.counted("misses") != 1 || e.counted("hits") != 0 || st.Objects != 1 || st.UsedBytes != int64(len(blob)) || st.Fills != 0 {
		t.Fatalf("after a miss: %+v", st)
	}
	if resp, _, err := rawGet(t, e, http.MethodGet, path, tok, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("second GET: %v %v", resp.StatusCode, err)
	}
	if e.counted("hits") != 1 || e.counted("misses") != 1 {
		t.Fatalf("after a hit: %v hits, %v misses", e.counted("hits"), e.counted("misses"))
	}

	// Another 120 KiB layer does not fit beside the first under a 200 KiB bound: the first goes.
	other := layerDigests(t, pushImage(t, up, "team/app", 120<<10, 1))[0].String()
	if resp, _, err := rawGet(t, e, http.MethodGet, "/v2/team/app/blobs/"+other, tok, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET another layer: %v %v", resp.StatusCode, err)
	}
	e.settle()
	if st = e.status(); e.counted("misses") != 2 || e.counted("evictions") != 1 || st.Objects != 1 || st.UsedBytes > st.LimitBytes {
		t.Fatalf("after an eviction: %+v", st)
	}

	out, _ := json.Marshal(st)
	u, _ := url.Parse(up.URL())
	for _, secret := range []string{digest[len("sha256:"):], other[len("sha256:"):], tok, "alice-secret-pw", u.Host, "team/app"} {
		if strings.Contains(string(out), secret) {
			t.Fatalf("the status shows %q: %s", secret, out)
		}
	}
}

// TestStatusWithoutACache: no cache directory, no cache facts.
func TestStatusWithoutACache(t *testing.T) {
	reg, err := registry.New(registry.Options{Upstream: "https://registry.example"})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if st := reg.Status().(registry.Status); st.Cache != "off" || st.LimitBytes != 0 || st.Objects != 0 {
		t.Fatalf("without a cache: %+v", st)
	}
}

// counted is relay_registry_cache_<what>_total summed over its labels: the counts the status
// page lists beside the registry's Status.
func (e *relayEnv) counted(what string) float64 {
	e.T.Helper()
	families, err := e.Registry.Gather()
	if err != nil {
		e.T.Fatal(err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() == "relay_registry_cache_"+what+"_total" {
			for _, m := range f.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// status is the registry's Status.
func (e *relayEnv) status() registry.Status {
	e.T.Helper()
	st, ok := e.reg.Status().(registry.Status)
	if !ok {
		e.T.Fatalf("Status() is a %T", e.reg.Status())
	}
	return st
}
