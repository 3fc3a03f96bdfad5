package ingress

import "github.com/prometheus/client_golang/prometheus"

// metrics of the ingress feature: namespace relay, subsystem ingress.
type metrics struct {
	registrations   *prometheus.CounterVec // outcome
	connections     prometheus.Gauge
	tableRevision   prometheus.Gauge
	tableBytes      prometheus.Gauge
	tableUpdates    *prometheus.CounterVec // source, outcome
	tableReads      *prometheus.CounterVec // outcome
	hints           *prometheus.CounterVec // outcome
	statsPages      *prometheus.CounterVec // outcome
	statsFailures   *prometheus.CounterVec // reason
	statsGivenUp    prometheus.Counter
	statsBucketsOut prometheus.Counter
	statsDropped    *prometheus.CounterVec // reason
}

func newMetrics() *metrics {
	const ns, sub = "relay", "ingress"
	counterVec := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels)
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	m := &metrics{
		registrations: counterVec("registrations_total",
			"registerClusterIngress outcomes: accepted, protocol-incompatible, cluster-ingress-registration-refused, a relay refusal name, or other.", "outcome"),
		connections:   gauge("connections", "Downstream connections that are accepted ingress connections."),
		tableRevision: gauge("route_table_revision", "Revision of the route table held (derived from its bytes when it states none); -1 while it is null."),
		tableBytes:    gauge("route_table_bytes", "Size of the route table held; 0 while it is null."),
		tableUpdates: counterVec("route_table_updates_total",
			"Route tables received from Cloudly by source (push, pull) and outcome (applied, stale, invalid, failed).", "source", "outcome"),
		tableReads: counterVec("route_table_reads_total",
			"getClusterIngressRouteTable answers by outcome: served, relay-ingress-only, relay-request-invalid.", "outcome"),
		hints: counterVec("route_table_hints_total",
			"pushClusterIngressRouteTableChanged hints by outcome: answered, or the refusal name of a failed one (other for a name the relay does not know).", "outcome"),
		statsPages: counterVec("statistics_pages_total",
			"getClusterTrafficStatistics pages by outcome: answered, relay-request-invalid.", "outcome"),
		statsFailures: counterVec("statistics_ingress_failures_total",
			"Ingress pages that failed within a statistics page, by reason: gone, timeout, refused, invalid.", "reason"),
		statsGivenUp: counter("statistics_ingresses_given_up_total",
			"Ingress positions a statistics cursor stopped retrying after repeated failures."),
		statsBucketsOut: counter("statistics_buckets_total", "Day buckets answered to Cloudly."),
		statsDropped: counterVec("statistics_buckets_dropped_total",
			"Day buckets an ingress answered that the relay dropped, by reason: foreign-node, out-of-range, malformed.", "reason"),
	}
	m.tableRevision.Set(-1)
	for _, r := range []string{dropForeignNode, dropOutOfRange, dropMalformed} {
		m.statsDropped.WithLabelValues(r)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.registrations, m.connections, m.tableRevision, m.tableBytes, m.tableUpdates,
		m.tableReads, m.hints, m.statsPages, m.statsFailures, m.statsGivenUp, m.statsBucketsOut, m.statsDropped}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
