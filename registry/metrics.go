package registry

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics of registry forwarding: namespace relay, subsystem registry.
type metrics struct {
	requests         *prometheus.CounterVec // kind, method
	bytes            *prometheus.CounterVec // source: upstream, cache
	hits             *prometheus.CounterVec // kind
	misses           *prometheus.CounterVec // kind
	coalesced        *prometheus.CounterVec // kind
	authorizations   *prometheus.CounterVec // outcome: allowed, refused, error
	evictions        prometheus.Counter
	bypass           *prometheus.CounterVec // reason
	fillFailures     *prometheus.CounterVec // reason
	redirectsRefused prometheus.Counter
	cacheBytes       prometheus.Gauge
	cacheObjects     prometheus.Gauge
	fillsInFlight    prometheus.Gauge
	slotsInUse       *prometheus.GaugeVec   // pool: fetch, authorize
	slotWaitsRefused *prometheus.CounterVec // pool, limit: source, total
	slowReadersCut   prometheus.Counter
}

func (m *metrics) hit(k kind) {
	m.hits.WithLabelValues(k.String()).Inc()
}

func (m *metrics) miss(k kind) {
	m.misses.WithLabelValues(k.String()).Inc()
}

func (m *metrics) coalesce(k kind) {
	m.coalesced.WithLabelValues(k.String()).Inc()
}

func (m *metrics) evicted() {
	m.evictions.Inc()
}

// bypassed counts a GET by digest served without the cache, by reason.
func (m *metrics) bypassed(reason string) {
	m.bypass.WithLabelValues(reason).Inc()
}

// Label values.
const (
	sourceUpstream = "upstream"
	sourceCache    = "cache"

	authAllowed = "allowed"
	authRefused = "refused"
	authError   = "error"

	bypassDisk         = "disk"          // the cache directory could not be written
	bypassTooLarge     = "too-large"     // larger than the cache bound, or the bound is taken by fills
	bypassNotCacheable = "not-cacheable" // the upstream's answer was not a plain 200 with a length
	bypassInconsistent = "inconsistent"  // the upstream's HEAD disagreed with the cached size or digest

	poolFetch     = "fetch"
	poolAuthorize = "authorize"
)

// The fixed label sets a peer's input is mapped into.
var (
	methodLabels       = []string{"get", "head", "post", "put", "patch", "delete", "other"}
	bypassReasons      = []string{bypassDisk, bypassTooLarge, bypassNotCacheable, bypassInconsistent}
	fillFailureReasons = []string{"digest-mismatch", "size-mismatch", "upstream", "stalled", "disk", "closed"}
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "relay", "registry"
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels)
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	m := &metrics{
		requests: counter("requests_total", "Requests under /v2/, by kind (blob, manifest, other) and HTTP method "+
			"(get, head, post, put, patch, delete, other).", "kind", "method"),
		bytes: counter("bytes_total", "Body bytes sent to callers, by source: upstream (forwarded or filling) "+
			"or cache (a stored object or another caller's fill).", "source"),
		hits:   counter("cache_hits_total", "GETs by digest served from a stored object after the upstream authorized them.", "kind"),
		misses: counter("cache_misses_total", "GETs by digest that fetched from the upstream.", "kind"),
		coalesced: counter("cache_coalesced_total", "GETs by digest that joined another caller's fetch of the same "+
			"digest after the upstream authorized them.", "kind"),
		authorizations: counter("upstream_authorizations_total", "HEAD requests asking the upstream to authorize a "+
			"caller before cached bytes are served, by outcome: allowed (2xx), refused (any other status), error.", "outcome"),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "cache_evictions_total",
			Help: "Stored objects removed to stay within the cache bound."}),
		bypass: counter("cache_bypass_total", "GETs by digest served without the cache, by reason: disk, too-large, "+
			"not-cacheable, inconsistent.", "reason"),
		fillFailures: counter("cache_fill_failures_total", "Fetches into the cache that were not published, by reason: "+
			"digest-mismatch, size-mismatch, upstream, stalled, disk, closed.", "reason"),
		redirectsRefused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "redirects_refused_total",
			Help: "Requests refused registry-redirect-refused: the upstream redirected off its origin to plain http or " +
				"to an address that is not public, or more than 5 times."}),
		cacheBytes:    gauge("cache_bytes", "Bytes of stored objects."),
		cacheObjects:  gauge("cache_objects", "Stored objects."),
		fillsInFlight: gauge("cache_fills_in_flight", "Fetches into the cache in progress."),
		slotsInUse: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "slots_in_use",
			Help: "Upstream slots held, by pool: fetch (forwards, held while their caller reads, and fills) or " +
				"authorize (the authorization HEADs of cache hits and joins)."}, []string{"pool"}),
		slotWaitsRefused: counter("slot_waits_refused_total", "Requests refused registry-upstream-busy after waiting "+
			"the slot wait, by pool (fetch, authorize) and the limit waited on: source (the caller's address held its "+
			"share) or total (the relay held every slot).", "pool", "limit"),
		slowReadersCut: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "slow_readers_cut_total",
			Help: "Callers cut for taking their answer slower than the minimum read rate over a window."}),
	}
	// Every label value is one of a fixed set, and each starts at zero so that a rate is defined
	// before the first event.
	kinds := []string{kindOther.String(), kindBlob.String(), kindManifest.String()}
	for _, k := range kinds {
		for _, meth := range methodLabels {
			m.requests.WithLabelValues(k, meth)
		}
		m.hits.WithLabelValues(k)
		m.misses.WithLabelValues(k)
		m.coalesced.WithLabelValues(k)
	}
	for _, v := range []string{sourceUpstream, sourceCache} {
		m.bytes.WithLabelValues(v)
	}
	for _, v := range []string{authAllowed, authRefused, authError} {
		m.authorizations.WithLabelValues(v)
	}
	for _, v := range bypassReasons {
		m.bypass.WithLabelValues(v)
	}
	for _, v := range fillFailureReasons {
		m.fillFailures.WithLabelValues(v)
	}
	for _, pool := range []string{poolFetch, poolAuthorize} {
		m.slotsInUse.WithLabelValues(pool)
		for _, limit := range []string{limitSource, limitTotal} {
			m.slotWaitsRefused.WithLabelValues(pool, limit)
		}
	}
	if reg != nil {
		for _, c := range m.collectors() {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.bytes, m.hits, m.misses, m.coalesced, m.authorizations, m.evictions,
		m.bypass, m.fillFailures, m.redirectsRefused, m.cacheBytes, m.cacheObjects, m.fillsInFlight,
		m.slotsInUse, m.slotWaitsRefused, m.slowReadersCut}
}

// fillFailureReason is the metric label of a fill's error.
func fillFailureReason(err error) string {
	switch err {
	case errDigestMismatch:
		return "digest-mismatch"
	case errSizeMismatch:
		return "size-mismatch"
	case errStalled:
		return "stalled"
	case errDisk:
		return "disk"
	case errClosed:
		return "closed"
	}
	return "upstream"
}
