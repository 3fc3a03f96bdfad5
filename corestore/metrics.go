package corestore

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"code.foss.global/serve.zone/relay/contracts"
)

// metrics of the Corestore client. Namespace relay, subsystem corestore.
type metrics struct {
	requests      *prometheus.CounterVec   // op, outcome
	duration      *prometheus.HistogramVec // op
	sentBytes     *prometheus.CounterVec   // op
	receivedBytes *prometheus.CounterVec   // op
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "corestore", Name: "requests_total",
			Help: "Calls to node Corestores by operation and outcome: answered, refused, oversized, unreachable, aborted."}, []string{"op", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "relay", Subsystem: "corestore", Name: "request_duration_seconds",
			Help:    "Time from sending a control to Corestore to the end of its answer, by operation.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"op"}),
		sentBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "corestore", Name: "sent_bytes_total",
			Help: "Control bytes sent to Corestores, by operation."}, []string{"op"}),
		receivedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "corestore", Name: "received_bytes_total",
			Help: "2xx answer bytes received from Corestores, by operation."}, []string{"op"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.sentBytes, m.receivedBytes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observe(op, outcome string, sent, received int, d time.Duration) {
	switch op {
	case contracts.CorestoreOpPrepare, contracts.CorestoreOpWrite, contracts.CorestoreOpStatus, contracts.CorestoreOpExecute, contracts.CorestoreOpCleanup,
		OpDesiredState, OpReadyBackups, OpBackupGet, OpDelivered, OpWanted, OpRestorePut:
	default:
		op = contracts.RefusalLabelOther // label values are a fixed set
	}
	m.requests.WithLabelValues(op, outcome).Inc()
	m.duration.WithLabelValues(op).Observe(d.Seconds())
	m.sentBytes.WithLabelValues(op).Add(float64(sent))
	m.receivedBytes.WithLabelValues(op).Add(float64(received))
}
