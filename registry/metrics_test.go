package registry

import (
	"regexp"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMetricNames: namespace relay, subsystem registry, counters end in _total and nothing else
// does, and the set is the documented one.
func TestMetricNames(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry())
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	var names []string
	for _, c := range m.collectors() {
		ch := make(chan *prometheus.Desc, 4)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			name := fqName.FindStringSubmatch(d.String())[1]
			names = append(names, name)
			_, isGauge := c.(prometheus.Gauge) // a Gauge also has a Counter's methods
			_, isCounterVec := c.(*prometheus.CounterVec)
			_, isCounter := c.(prometheus.Counter)
			counter := isCounterVec || isCounter && !isGauge
			if ok, _ := regexp.MatchString(`^relay_registry_[a-z_]+[a-z]$`, name); !ok {
				t.Errorf("%s: not relay_registry_<snake_case>", name)
			}
			if hasTotal, _ := regexp.MatchString(`_total$`, name); hasTotal != counter {
				t.Errorf("%s: counters, and only counters, end in _total", name)
			}
		}
	}
	want := []string{
		"relay_registry_bytes_total",
		"relay_registry_cache_bypass_total",
		"relay_registry_cache_bytes",
		"relay_registry_cache_coalesced_total",
		"relay_registry_cache_evictions_total",
		"relay_registry_cache_fill_failures_total",
		"relay_registry_cache_fills_in_flight",
		"relay_registry_cache_hits_total",
		"relay_registry_cache_misses_total",
		"relay_registry_cache_objects",
		"relay_registry_requests_total",
		"relay_registry_upstream_authorizations_total",
	}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Errorf("metric names\n got %v\nwant %v", names, want)
	}
}
