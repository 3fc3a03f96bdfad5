package escrow

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"code.foss.global/serve.zone/relay/contracts"
)

// metrics are the escrow's Prometheus metrics: namespace relay, subsystem escrow.
type metrics struct {
	runs     prometheus.Gauge       // relay_escrow_runs_held
	renewals prometheus.Gauge       // relay_escrow_renewals_held
	holds    *prometheus.CounterVec // relay_escrow_holds_total{outcome}
	dropped  *prometheus.CounterVec // relay_escrow_runs_dropped_total{reason}
	releases *prometheus.CounterVec // relay_escrow_releases_total{outcome}
	delay    prometheus.Histogram   // relay_escrow_release_delay_seconds
	// unverified is relay_escrow_digest_unverified_total: renewals held whose well-formed digest the
	// relay's assumed rule does not reproduce (contracts.RenewalDigestVerified).
	unverified prometheus.Counter

	releasesBy map[string]prometheus.Counter // releases by outcome, resolved once

	// pushes counts applyRuntimeNetworkDnsLeaseRenewal pushes sent, answered or not, for Status.
	// The outcomes are counted once, in the Prometheus counters above, which the status page lists.
	pushes atomic.Int64
	// unverifiedHeld is unverified's count, for Status.
	unverifiedHeld atomic.Int64
}

// released counts one release outcome.
func (m *metrics) released(outcome string) {
	if c, ok := m.releasesBy[outcome]; ok {
		c.Inc()
		return
	}
	m.releases.WithLabelValues(outcome).Inc()
}

// held counts one hold outcome: held, cleared or the refusal name.
func (m *metrics) held(outcome string) {
	m.holds.WithLabelValues(outcome).Inc()
}

// droppedRun counts one run dropped, by reason.
func (m *metrics) droppedRun(why string) {
	m.dropped.WithLabelValues(why).Inc()
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "relay", "escrow"
	m := &metrics{
		runs: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "runs_held",
			Help: "Nodes whose DNS lease renewal run the relay holds."}),
		renewals: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "renewals_held",
			Help: "Signed DNS lease renewals held across all runs."}),
		holds: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "holds_total",
			Help: "holdRuntimeNetworkDnsLeaseRenewals requests by outcome: held, cleared, or the refusal name."}, []string{"outcome"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "runs_dropped_total",
			Help: "Runs the relay stopped holding, by reason: expired, cleared, custody-ended, foreign-session."}, []string{"reason"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "releases_total",
			Help: "applyRuntimeNetworkDnsLeaseRenewal pushes by outcome: accepted, replay, refused, mismatch, failed."}, []string{"outcome"}),
		unverified: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "digest_unverified_total",
			Help: "Renewals held whose well-formed digest the relay's assumed digest rule does not reproduce; the node verifies it."}),
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "release_delay_seconds",
			Help:    "From the moment a renewal became due (its notBefore, or the detach or registration after it) to its first push.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}),
	}
	// Every known label value starts at zero, so that a rate is defined before the first event.
	holdOutcomes := []string{"held", "cleared"}
	for _, n := range contracts.HoldRuntimeNetworkDnsLeaseRenewalsRefusals() {
		holdOutcomes = append(holdOutcomes, string(n))
	}
	for _, o := range holdOutcomes {
		m.holds.WithLabelValues(o)
	}
	dropReasons := []string{dropExpired, dropCleared, dropCustody, dropForeign}
	for _, r := range dropReasons {
		m.dropped.WithLabelValues(r)
	}
	releaseOutcomes := []string{outcomeAccepted, outcomeReplay, outcomeRefused, outcomeMismatch, outcomeFailed}
	m.releasesBy = make(map[string]prometheus.Counter)
	for _, o := range releaseOutcomes {
		m.releasesBy[o] = m.releases.WithLabelValues(o)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.runs, m.renewals, m.holds, m.dropped, m.releases, m.delay, m.unverified} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
