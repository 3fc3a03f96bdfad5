package platform

import "github.com/prometheus/client_golang/prometheus"

// Outcome labels besides refusal names (contracts.RefusalLabel, a fixed set).
const (
	outcomeAnswered    = "answered"     // a desired state pulled and read
	outcomeHanded      = "handed"       // a desired state Corestore took
	outcomeListed      = "listed"       // a Corestore listing read
	outcomeDelivered   = "delivered"    // a backup Cloudly accepted and Corestore heard of
	outcomeNotAccepted = "not-accepted" // Cloudly answered { accepted: false }
	outcomeSettled     = "settled"      // a restore Corestore took whole
	outcomeEnrolled    = "enrolled"     // a secret-recipient enrollment completed
	outcomeAccepted    = "accepted"     // a credential push opened and kept
)

// metrics of the platform agent. Namespace relay, subsystem platform; every label a fixed set.
type metrics struct {
	pulls       *prometheus.CounterVec // outcome
	handOvers   *prometheus.CounterVec // outcome
	listings    *prometheus.CounterVec // outcome
	backups     *prometheus.CounterVec // outcome
	restores    *prometheus.CounterVec // outcome
	enrollments *prometheus.CounterVec // outcome
	credentials *prometheus.CounterVec // outcome
	bytes       *prometheus.CounterVec // direction: to-cloudly, to-corestore
	frames      *prometheus.CounterVec // reason: unreadable, dropped
	dropped     prometheus.Counter
	corestores  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, inflight func() float64) (*metrics, error) {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "platform", Name: name, Help: help}, labels)
	}
	m := &metrics{
		pulls:       counter("desired_state_pulls_total", "Platform desired states pulled from Cloudly, by outcome: answered, or the refusal name.", "outcome"),
		handOvers:   counter("desired_state_handovers_total", "Desired states handed to node Corestores, by outcome: handed, or the refusal name.", "outcome"),
		listings:    counter("listings_total", "Backup and restore listings read from node Corestores, by outcome: listed, or the refusal name.", "outcome"),
		backups:     counter("backups_total", "Database backups carried to Cloudly, by outcome: delivered, not-accepted, or the refusal name.", "outcome"),
		restores:    counter("restores_total", "Database restores carried to node Corestores, by outcome: settled, or the refusal name.", "outcome"),
		enrollments: counter("enrollments_total", "Secret-recipient enrollments, by outcome: enrolled, or the refusal name.", "outcome"),
		credentials: counter("credentials_total", "Corestore credential pushes from Cloudly, by outcome: accepted, or the refusal name.", "outcome"),
		bytes:       counter("closure_bytes_total", "Closure bytes carried, by direction: to-cloudly (backups), to-corestore (restores).", "direction"),
		frames:      counter("stream_frames_dropped_total", "Cloudly's frames for a closure stream the agent did not take, by reason: unreadable, dropped.", "reason"),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "relay", Subsystem: "platform", Name: "credentials_dropped_total",
			Help: "Corestore credentials dropped after a detach outlasted the escrow horizon."}),
		corestores: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Subsystem: "platform", Name: "corestores",
			Help: "Nodes the platform agent works for: those whose Corestore origin the newest relay configuration names."}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.pulls, m.handOvers, m.listings, m.backups, m.restores, m.enrollments, m.credentials,
		m.bytes, m.frames, m.dropped, m.corestores,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Subsystem: "platform", Name: "closures_inflight",
			Help: "Database closures being carried now, both directions."}, inflight)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
