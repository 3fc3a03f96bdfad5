package ha

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the election's: namespace relay, subsystem ha (docs/ha.md).
type metrics struct {
	leader         prometheus.Gauge       // relay_ha_leader
	transitions    *prometheus.CounterVec // relay_ha_transitions_total{to}
	replicatedRuns prometheus.Gauge       // relay_ha_replicated_runs
	standbys       prometheus.Gauge       // relay_ha_standbys_connected
	complete       prometheus.Gauge       // relay_ha_replication_complete
	unreplicated   *prometheus.CounterVec // relay_ha_holds_unreplicated_total{reason}
	dropped        *prometheus.CounterVec // relay_ha_standbys_dropped_total{reason}
	refused        *prometheus.CounterVec // relay_ha_replication_refused_total{reason}
	acceptErrors   prometheus.Counter     // relay_ha_replication_accept_errors_total
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "relay", "ha"
	m := &metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "leader",
			Help: "1 while this relay holds the Lease and leads its cluster."}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "transitions_total",
			Help: "Role changes, by the role taken: leader or standby."}, []string{"to"}),
		replicatedRuns: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "replicated_runs",
			Help: "On the leader: escrowed runs it replicates; on a standby: runs it holds as a copy."}),
		standbys: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "standbys_connected",
			Help: "On the leader: standbys copying its escrow."}),
		complete: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "replication_complete",
			Help: "On a standby: 1 while its copy of the leader's escrow is whole and current."}),
		unreplicated: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "holds_unreplicated_total",
			Help: "On the leader: holds answered before every standby had them, by reason: no-standby (none with a complete copy connected), ack-missed (one did not acknowledge within --ha-replication-ack, or went away first)."}, []string{"reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "standbys_dropped_total",
			Help: "On the leader: standbys no longer fed, by reason: ack-missed, silent, queue-full, replaced, ack-invalid, stepped-down, write-stalled, closed."}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "replication_refused_total",
			Help: "Replication connections refused before anything was fed, by reason: limit, handshake, hello, pod, not-leading."}, []string{"reason"}),
		acceptErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "replication_accept_errors_total",
			Help: "Failed accepts on the replication listener, each retried after a backoff."}),
	}
	for _, r := range []string{unreplicatedNoStandby, unreplicatedAckMissed} {
		m.unreplicated.WithLabelValues(r)
	}
	for _, r := range dropReasons {
		m.dropped.WithLabelValues(r)
	}
	for _, r := range refusalReasons {
		m.refused.WithLabelValues(r)
	}
	for _, to := range []string{RoleLeader, RoleStandby} {
		m.transitions.WithLabelValues(to)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.leader, m.transitions, m.replicatedRuns, m.standbys, m.complete,
		m.unreplicated, m.dropped, m.refused, m.acceptErrors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register ha metrics: %w", err)
		}
	}
	return m, nil
}
