package vpnhub

import (
	"github.com/prometheus/client_golang/prometheus"

	"code.foss.global/serve.zone/relay/contracts"
)

// metrics are the hub's Prometheus metrics: namespace relay, subsystem vpnhub. Per-packet
// counters are resolved once at construction, so counting allocates nothing. Every label value
// is from a fixed, kebab-case set.
type metrics struct {
	members    prometheus.Gauge
	sessions   prometheus.Gauge
	generation prometheus.Gauge
	handshakes *prometheus.CounterVec
	packets    prometheus.Counter
	bytes      prometheus.Counter
	keepAlives prometheus.Counter
	drops      *prometheus.CounterVec
	closes     *prometheus.CounterVec

	dropBy [dropReasons]prometheus.Counter
}

// dropReason is why the data plane dropped a packet.
type dropReason uint8

const (
	dropNone            dropReason = iota
	dropMalformed                  // too short for a datagram, or not a well-formed IPv4 packet
	dropUnauthenticated            // the AEAD did not open it
	dropReplayed                   // a counter already seen or older than the window
	dropSpoofed                    // inner source is not the member's control address
	dropNotUnicast                 // multicast or broadcast destination
	dropUnknownDest                // no session at the destination address
	dropExpired                    // source or destination member past expiresAt
	dropTooLarge                   // larger than the destination's mtu
	dropQueueFull                  // the destination's queue was full: its oldest packet went
	dropStandby                    // the hub's relay does not lead: it forwards nothing (lead.go)
	dropReasons
)

var dropReasonNames = [dropReasons]string{
	"", "malformed", "unauthenticated", "replayed", "spoofed", "not-unicast", "unknown-destination",
	"expired", "too-large", "queue-full", "standby",
}

func (r dropReason) String() string { return dropReasonNames[r] }

// Handshake outcomes besides the refusal names.
const (
	outcomeAccepted    = "accepted"
	outcomeRateLimited = "rate-limited"
	outcomeBusy        = "busy"   // Config.MaxHandshakes handshakes were in progress
	outcomeBroken      = "broken" // timed out, I/O failed, a frame or the QUIC connection unusable
)

// Session close reasons besides the refusal names.
const (
	closeLeft     = "left"     // the node closed its connection, or it timed out
	closeShutdown = "shutdown" // the hub stopped
)

// newMetrics creates the hub's metrics, unregistered.
func newMetrics() *metrics {
	const ns, sub = "relay", "vpnhub"
	m := &metrics{
		members: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "members",
			Help: "Members in the membership the hub holds."}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "sessions",
			Help: "Established member sessions."}),
		generation: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "membership_generation",
			Help: "Generation of the membership the hub holds (-1: none yet)."}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "handshakes_total",
			Help: "Handshakes by outcome: accepted, a refusal name, rate-limited, busy or broken."}, []string{"outcome"}),
		packets: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "forwarded_packets_total",
			Help: "Packets forwarded from one member to another."}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "forwarded_bytes_total",
			Help: "Inner packet bytes forwarded from one member to another."}),
		keepAlives: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "keepalives_total",
			Help: "Empty keep-alive datagrams received from members."}),
		drops: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "dropped_packets_total",
			Help: "Packets dropped by reason."}, []string{"reason"}),
		closes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "session_closes_total",
			Help: "Sessions ended by reason: a refusal name, left or shutdown."}, []string{"reason"}),
	}
	m.generation.Set(-1)
	for r := dropNone + 1; r < dropReasons; r++ {
		m.dropBy[r] = m.drops.WithLabelValues(r.String())
	}
	handshakes := []string{outcomeAccepted, outcomeRateLimited, outcomeBusy, outcomeBroken}
	var closes []string
	for _, n := range contracts.VPNRefusals() {
		if n != contracts.VPNMemberReplaced && n != contracts.VPNSessionSilent { // never a handshake's
			handshakes = append(handshakes, string(n))
		}
		switch n {
		case contracts.VPNMemberRemoved, contracts.VPNMemberReplaced, contracts.VPNSessionSilent,
			contracts.VPNMemberExpired, contracts.VPNAuthorityMismatch, contracts.VPNHubStandby: // what ends a live session
			closes = append(closes, string(n))
		}
	}
	closes = append(closes, closeLeft, closeShutdown)
	for _, o := range handshakes {
		m.handshakes.WithLabelValues(o)
	}
	for _, r := range closes {
		m.closes.WithLabelValues(r)
	}
	return m
}

// register registers every metric with reg; nil registers none.
func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{m.members, m.sessions, m.generation, m.handshakes, m.packets, m.bytes, m.keepAlives, m.drops, m.closes} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *metrics) drop(r dropReason) {
	m.dropBy[r].Inc()
}

// handshake counts one handshake by outcome: accepted, a refusal name, rate-limited, busy or broken.
func (m *metrics) handshake(outcome string) {
	m.handshakes.WithLabelValues(outcome).Inc()
}

// closed counts one session's end by reason: a refusal name, left or shutdown.
func (m *metrics) closed(reason string) {
	m.closes.WithLabelValues(reason).Inc()
}
