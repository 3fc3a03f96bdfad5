package restore

import "github.com/prometheus/client_golang/prometheus"

// metrics of isolated restore. Namespace relay, subsystem restore.
type metrics struct {
	requests    *prometheus.CounterVec // method, outcome
	stagedBytes prometheus.Counter
	corestores  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, inflight func() float64) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "restore", Name: "requests_total",
			Help: "Isolated-restore calls from Cloudly by method and outcome: answered, or the refusal name."}, []string{"method", "outcome"}),
		stagedBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "relay", Subsystem: "restore", Name: "staged_bytes_total",
			Help: "Decoded archive chunk bytes Corestores accepted through stageIsolatedRestoreArchive."}),
		corestores: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Subsystem: "restore", Name: "corestores",
			Help: "Nodes whose Corestore origin the newest relay configuration names."}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.stagedBytes, m.corestores,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Subsystem: "restore", Name: "inflight",
				Help: "Isolated-restore calls waiting for a Corestore answer."}, inflight))
	}
	return m
}
