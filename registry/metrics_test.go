package registry

import (
	"regexp"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricNames: namespace relay, subsystem registry, counters end in _total and nothing else
// does, and the set is the documented one.
func TestMetricNames(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
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
		"relay_registry_redirects_refused_total",
		"relay_registry_requests_total",
		"relay_registry_slot_waits_refused_total",
		"relay_registry_slots_in_use",
		"relay_registry_slow_readers_cut_total",
		"relay_registry_upstream_authorizations_total",
	}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Errorf("metric names\n got %v\nwant %v", names, want)
	}
}

// TestMetricLabels: label values are kebab-case, come from fixed sets that start at zero, and a
// method a caller makes up counts as other; a registry that cannot register its metrics says so.
func TestMetricLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, meth := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "BREW", "get", "M-SEARCH"} {
		m.requests.WithLabelValues(kindBlob.String(), methodLabel(meth)).Inc()
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	kebab := regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)
	series := 0
	for _, f := range families {
		for _, s := range f.GetMetric() {
			series++
			for _, l := range s.GetLabel() {
				if !kebab.MatchString(l.GetValue()) {
					t.Errorf("%s{%s=%q}: not kebab-case", f.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
	// 3 kinds × 7 methods, 3 × 3 kind counters, 2 sources, 3 outcomes, 4 bypass and 6 fill failure
	// reasons, 2 slot pools, 2 pools × 2 limits of refused waits, and 6 unlabelled series: every
	// series exists before its first event, and no peer's input adds one.
	if want := 21 + 9 + 2 + 3 + 4 + 6 + 2 + 4 + 6; series != want {
		t.Errorf("%d series, want %d", series, want)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues("blob", "other")); got != 3 {
		t.Errorf("requests{method=other} = %v, want 3 (BREW, get, M-SEARCH)", got)
	}
	if _, err := newMetrics(reg); err == nil {
		t.Error("registering the metrics twice did not fail")
	}
}
