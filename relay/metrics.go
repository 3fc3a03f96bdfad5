package relay

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// Metrics of the relay core: namespace relay, subsystems upstream and downstream. Label values are
// fixed sets in kebab-case; a refusal name a peer sends counts as contracts.RefusalLabel says.

// upstreamMetrics are the Cloudly session's; the upstream counts them itself.
type upstreamMetrics struct {
	attached      prometheus.Gauge
	attaches      prometheus.Counter
	detaches      prometheus.Counter
	registrations *prometheus.CounterVec // outcome
	hubReports    *prometheus.CounterVec // outcome: hubReportOutcomes
}

type metrics struct {
	up           upstreamMetrics
	connections  prometheus.Gauge
	nodes        prometheus.Gauge
	nodeRegs     *prometheus.CounterVec // outcome
	forwarded    *prometheus.CounterVec // direction, outcome
	refusals     *prometheus.CounterVec // name
	dropped      *prometheus.CounterVec // reason
	unregistered *prometheus.CounterVec // reason: connections refused or closed before registering
	streamFrames *prometheus.CounterVec // direction
	rebound      prometheus.Counter     // registrations answered while detached (detached re-binding)
}

// newMetrics makes the relay's metrics; registerMetrics registers them.
func newMetrics() *metrics {
	m := &metrics{
		up: upstreamMetrics{
			attached: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Subsystem: "upstream", Name: "attached",
				Help: "1 while the relay holds an accepted registration with Cloudly."}),
			attaches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "relay", Subsystem: "upstream", Name: "attaches_total",
				Help: "Accepted registrations with Cloudly."}),
			detaches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "relay", Subsystem: "upstream", Name: "detaches_total",
				Help: "Attached Cloudly sessions lost."}),
			registrations: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "upstream", Name: "registrations_total",
				Help: "registerClusterRelay attempts by outcome: accepted, a refusal name (other for a name outside the vocabularies), or failed."},
				[]string{"outcome"}),
			hubReports: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "upstream", Name: "hub_reports_total",
				Help: "registerClusterVpnHub reports of the VPN hub after an accepted registration, by outcome: accepted, refused, unknown-method (Cloudly does not serve the call), timeout, or failed (not sent, or the socket was lost first)."},
				[]string{"outcome"}),
		},
		connections: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Subsystem: "downstream", Name: "connections",
			Help: "Open downstream WebSocket connections."}),
		nodes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Subsystem: "downstream", Name: "nodes",
			Help: "Nodes carried: connections bound to a node session."}),
		nodeRegs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "downstream", Name: "registrations_total",
			Help: "registerPalletRuntimeSession by outcome: accepted, or the refusal name (other for a name outside the vocabularies)."},
			[]string{"outcome"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "downstream", Name: "forwarded_requests_total",
			Help: "Requests forwarded between nodes and Cloudly, by direction (to-cloudly, to-node) and outcome (answered, error, refused)."},
			[]string{"direction", "outcome"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "downstream", Name: "refusals_total",
			Help: "Requests the relay itself refused, by refusal name."}, []string{"name"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "downstream", Name: "dropped_total",
			Help: "Messages the relay did not deliver, by reason."}, []string{"reason"}),
		unregistered: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "downstream", Name: "unregistered_closed_total",
			Help: "Connections refused or closed before a registration was accepted, by reason: limit, source-limit, overdue, " +
				"budget (the unregistered half of the peer memory budget is spent), descriptors (refused at accept: at the descriptor cap every connection is registered), " +
				"descriptors-oldest (the oldest unregistered one closed to make room at the cap), " +
				"frame-slow (a message arrived slower than --first-frame-timeout or --min-frame-rate allow), " +
				"partial-oldest (the one holding a partial message longest closed to admit another's), " +
				"rate (under load, closed at accept past its address's --upgrade-rate-per-source), " +
				"not-registration (closed at a message that was no request, or under load at any but a registration), refusals (closed at a refused request past one a second, two at once), registrations (under load, closed at a registration sent while its last one was at Cloudly or past the connection's eight)."}, []string{"reason"}),
		streamFrames: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Subsystem: "downstream", Name: "stream_frames_total",
			Help: "VirtualStream frames forwarded, by direction (to-cloudly, to-node)."}, []string{"direction"}),
		rebound: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "relay", Subsystem: "downstream", Name: "rebound_total",
			Help: "Node registrations answered while detached with Cloudly's earlier answer to the same registration, and bound again."}),
	}
	for _, outcome := range hubReportOutcomes {
		m.up.hubReports.WithLabelValues(outcome) // every series from the start, at 0
	}
	return m
}

// registerMetrics registers the relay's metrics, with gauges read from its parts, in reg.
func (r *Relay) registerMetrics(reg prometheus.Registerer) error {
	m, budget := r.metrics, r.down.budget
	gauge := func(subsystem, name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Subsystem: subsystem, Name: name, Help: help}, f)
	}
	counter := func(name, help string, f func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "relay", Subsystem: "downstream", Name: name, Help: help},
			func() float64 { return float64(f()) })
	}
	// relay_build_info is the one metric outside a subsystem, as the Prometheus Go client's own
	// build_info collector names it: 1, its labels the build.
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "relay", Name: "build_info",
		Help: "1; the labels are the relay build (version), the @serve.zone/interfaces release it speaks (protocol) and the Go release it was built with (goversion)."},
		[]string{"version", "protocol", "goversion"})
	build.WithLabelValues(r.cfg.BuildVersion, contracts.InterfacesVersion, runtime.Version()).Set(1)
	for _, c := range []prometheus.Collector{
		build, newCertExpiry(r.certs), m.up.attached, m.up.attaches, m.up.detaches, m.up.registrations, m.up.hubReports,
		m.connections, m.nodes, m.nodeRegs, m.forwarded, m.refusals, m.dropped, m.unregistered, m.streamFrames, m.rebound,
		gauge("upstream", "queued_frames", "Frames waiting to be written to Cloudly.", func() float64 { return float64(r.up.queueLen()) }),
		gauge("upstream", "pending_calls", "Requests to Cloudly, queued or sent, awaiting its answer.", func() float64 { return float64(r.up.pendingCalls()) }),
		gauge("downstream", "queued_frames", "Frames waiting to be written to downstream connections, summed.", r.down.peers.queued),
		gauge("downstream", "streams", "VirtualStreams bound to node connections.", func() float64 { return float64(r.streams.len()) }),
		gauge("downstream", "budget_used_bytes", "Bytes held for downstream peers, charged to the peer memory budget.",
			func() float64 { return float64(budget.Used()) }),
		gauge("downstream", "budget_limit_bytes", "The peer memory budget (--peer-memory-bytes).",
			func() float64 { return float64(budget.Limit()) }),
		gauge("downstream", "budget_waiters", "Charges waiting for room in the peer memory budget: reads held on their peers' sockets until bytes are released.",
			func() float64 { return float64(budget.Waiters()) }),
		counter("budget_refusals_total", "Charges refused because the peer memory budget was spent.", budget.Refusals),
		counter("budget_evictions_total", "Connections closed, the heaviest that read nothing first, to bring the budget back under its limit.",
			budget.Evictions),
		counter("budget_underflows_total", "Releases of bytes never charged: always 0 unless the relay's accounting is wrong.",
			budget.Underflows),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register relay metrics: %w", err)
		}
	}
	return nil
}

// refused counts a refusal the relay itself answered; a peer's own error passed on is not one.
func (m *metrics) refused(err error) {
	var remote *typedsocket.Error
	if err == nil || errors.As(err, &remote) {
		return
	}
	m.refusals.WithLabelValues(contracts.RefusalLabel(err)).Inc()
}
