package restore

import "github.com/prometheus/client_golang/prometheus"

// metrics of isolated restore. Namespace relay, subsystem restore.
type metrics struct {
	requests   *prometheus.CounterVec // op, outcome
	corestores prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, inflight func() float64) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "restore", Name: "requests_total",
			Help: "Isolated-restore calls from Cloudly by Corestore operation (prepare, write, status, execute, cleanup) and outcome: answered, or the refusal name."},
			[]string{"op", "outcome"}),
		corestores: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Subsystem: "restore", Name: "corestores",
			Help: "Nodes whose Corestore origin the newest relay configuration names."}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.corestores,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Subsystem: "restore", Name: "inflight",
			Help: "Isolated-restore calls waiting for a Corestore answer."}, inflight)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
