package relay

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"code.foss.global/serve.zone/relay/contracts"
)

// metrics of the relay core. Namespace relay; subsystems upstream and downstream.
type metrics struct {
	attached      prometheus.Gauge
	attaches      prometheus.Counter
	detaches      prometheus.Counter
	upstreamRegs  *prometheus.CounterVec // outcome
	connections   prometheus.Gauge
	nodes         prometheus.Gauge
	nodeRegs      *prometheus.CounterVec // outcome
	forwarded     *prometheus.CounterVec // direction, outcome
	refusals      *prometheus.CounterVec // name
	dropped       *prometheus.CounterVec // reason
	unregistered  *prometheus.CounterVec // reason: connections refused or closed before registering
	streamFrames  *prometheus.CounterVec // direction
	upstreamQueue prometheus.GaugeFunc
}

func newMetrics(reg prometheus.Registerer, upstreamQueue, downstreamQueue func() float64) *metrics {
	m := &metrics{
		attached: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Subsystem: "upstream", Name: "attached",
			Help: "1 while the relay holds an accepted registration with Cloudly."}),
		attaches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "relay", Subsystem: "upstream", Name: "attaches_total",
			Help: "Accepted registrations with Cloudly."}),
		detaches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "relay", Subsystem: "upstream", Name: "detaches_total",
			Help: "Attached Cloudly sessions lost."}),
		upstreamRegs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "upstream", Name: "registrations_total",
			Help: "registerClusterRelay attempts by outcome: accepted, a refusal name, or failed."}, []string{"outcome"}),
		connections: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Subsystem: "downstream", Name: "connections",
			Help: "Open downstream WebSocket connections."}),
		nodes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Subsystem: "downstream", Name: "nodes",
			Help: "Nodes carried: connections bound to a node session."}),
		nodeRegs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "downstream", Name: "registrations_total",
			Help: "registerPalletRuntimeSession by outcome: accepted, or the refusal name."}, []string{"outcome"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "downstream", Name: "forwarded_requests_total",
			Help: "Requests forwarded between nodes and Cloudly, by direction (to-cloudly, to-node) and outcome (answered, error, refused)."},
			[]string{"direction", "outcome"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "downstream", Name: "refusals_total",
			Help: "Requests the relay itself refused, by refusal name."}, []string{"name"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "downstream", Name: "dropped_total",
			Help: "Messages the relay did not deliver, by reason."}, []string{"reason"}),
		unregistered: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "downstream", Name: "unregistered_closed_total",
			Help: "Connections refused or closed before a registration was accepted, by reason: limit, overdue."}, []string{"reason"}),
		streamFrames: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "downstream", Name: "stream_frames_total",
			Help: "VirtualStream frames forwarded, by direction (to-cloudly, to-node)."}, []string{"direction"}),
		upstreamQueue: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Subsystem: "upstream", Name: "queued_frames",
			Help: "Frames waiting to be written to Cloudly."}, upstreamQueue),
	}
	downQueue := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Subsystem: "downstream", Name: "queued_frames",
		Help: "Frames waiting to be written to downstream connections, summed."}, downstreamQueue)
	reg.MustRegister(m.attached, m.attaches, m.detaches, m.upstreamRegs, m.connections, m.nodes, m.nodeRegs,
		m.forwarded, m.refusals, m.dropped, m.unregistered, m.streamFrames, m.upstreamQueue, downQueue)
	return m
}

// refused counts a refusal the relay itself answered.
func (m *metrics) refused(err error) {
	var r *contracts.Refusal
	var pr *contracts.ProtocolRefusal
	switch {
	case errors.As(err, &r):
		m.refusals.WithLabelValues(string(r.Name)).Inc()
	case errors.As(err, &pr):
		m.refusals.WithLabelValues(contracts.ProtocolIncompatibleCode).Inc()
	}
}
