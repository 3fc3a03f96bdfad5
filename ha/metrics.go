package ha

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the election's: namespace relay, subsystem ha (SPEC §16).
type metrics struct {
	leader         prometheus.Gauge       // relay_ha_leader
	transitions    *prometheus.CounterVec // relay_ha_transitions_total{to}
	replicatedRuns prometheus.Gauge       // relay_ha_replicated_runs
	standbys       prometheus.Gauge       // relay_ha_standbys_connected
	complete       prometheus.Gauge       // relay_ha_replication_complete
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
	}
	for _, to := range []string{RoleLeader, RoleStandby} {
		m.transitions.WithLabelValues(to)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.leader, m.transitions, m.replicatedRuns, m.standbys, m.complete} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register ha metrics: %w", err)
		}
	}
	return m, nil
}
