package vpnhub

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
)

// plane is the hub's data plane without sockets: two sessions with their keys, no QUIC.
type plane struct {
	h          *Hub
	a, b       *session
	aSend      *sealer // a's client side: seals what a sends
	bOpen      *opener // b's client side: opens what the hub sends b
	queueLimit int
}

func newPlane(t testing.TB, queueLen int) *plane {
	clock := newFakeClock(testNow)
	h := &Hub{cfg: Config{QueueLen: queueLen}, log: zerolog.Nop(), m: NewMetrics(), clock: clock,
		sessions: map[[32]byte]*session{}, routes: map[uint32]*session{}}
	ka, kb := testKey(t, 2), testKey(t, 3)
	h.view.Store(testView(testMember(ka, "node-a", 2), testMember(kb, "node-b", 3)))
	mk := func(k StaticKey, node string, last byte, keys transportKeys) *session {
		acc := accepted{keys: keys, member: testMember(k, node, last), authority: testAuthority}
		s := &session{hub: h, member: acc.member, authority: acc.authority, addr: addrU32(acc.member.ControlAddress), mtu: 1400,
			queue: newPacketQueue(queueLen), open: newOpener(keys.recv), seal: newSealer(keys.send, 1400)}
		s.expiresAt.Store(acc.member.ExpiresAt)
		h.sessions[k.Public] = s
		h.routes[s.addr] = s
		return s
	}
	p := &plane{h: h}
	p.a = mk(ka, "node-a", 2, transportKeys{send: [32]byte{1}, recv: [32]byte{2}})
	p.b = mk(kb, "node-b", 3, transportKeys{send: [32]byte{3}, recv: [32]byte{4}})
	p.aSend = newSealer([32]byte{2}, 1400)
	p.bOpen = newOpener([32]byte{3})
	return p
}

// fromA seals packet as node-a's client would and returns a fresh datagram.
func (p *plane) fromA(packet []byte) []byte {
	d, _ := p.aSend.seal(packet)
	return bytes.Clone(d)
}

func TestForwardReencryptsForTheDestination(t *testing.T) {
	p := newPlane(t, 8)
	pkt := ipv4Packet(addrA, addrB, []byte("hello"))
	p.h.forward(p.a, p.fromA(pkt))
	q := p.b.queue.pop()
	if !bytes.Equal(q, pkt) {
		t.Fatalf("queued %q", q)
	}
	d, _ := p.b.seal.seal(q)
	got, reason := p.bOpen.open(bytes.Clone(d))
	if reason != dropNone || !bytes.Equal(got, pkt) {
		t.Fatalf("b's client opened %q (%v)", got, reason)
	}
}

func TestForwardDropsByReason(t *testing.T) {
	p := newPlane(t, 2)
	cases := []struct {
		name   string
		packet []byte
		want   dropReason
	}{
		{"spoofed", ipv4Packet(addrB, addrB, nil), dropSpoofed},
		{"unknown", ipv4Packet(addrA, netip.MustParseAddr("10.64.0.9"), nil), dropUnknownDest},
		{"broadcast", ipv4Packet(addrA, netip.MustParseAddr("10.64.0.255"), nil), dropNotUnicast},
		{"multicast", ipv4Packet(addrA, netip.MustParseAddr("224.0.0.1"), nil), dropNotUnicast},
		{"too large", ipv4Packet(addrA, addrB, make([]byte, 1400)), dropTooLarge},
		{"truncated", ipv4Packet(addrA, addrB, nil)[:19], dropMalformed},
		{"bad length", append(ipv4Packet(addrA, addrB, nil), 0), dropMalformed},
	}
	for _, c := range cases {
		before := testutil.ToFloat64(p.h.m.dropBy[c.want])
		p.h.forward(p.a, p.fromA(c.packet))
		if got := testutil.ToFloat64(p.h.m.dropBy[c.want]); got != before+1 {
			t.Errorf("%s: dropped_packets_total{reason=%q} %v -> %v", c.name, c.want, before, got)
		}
	}
	if p.b.queue.len() != 0 {
		t.Fatal("a dropped packet was queued")
	}
	// Expiry is judged per packet too, before the timer closes the session.
	p.h.clock.(*fakeClock).Advance(60_000 * 1e6)
	p.h.forward(p.a, p.fromA(ipv4Packet(addrA, addrB, nil)))
	if testutil.ToFloat64(p.h.m.dropBy[dropExpired]) != 1 {
		t.Fatal("a packet of an expired member was not dropped as expired")
	}
}

func TestFullQueueDropsItsOldestPacket(t *testing.T) {
	p := newPlane(t, 2)
	for i := byte(0); i < 3; i++ {
		p.h.forward(p.a, p.fromA(ipv4Packet(addrA, addrB, []byte{i})))
	}
	if got := testutil.ToFloat64(p.h.m.dropBy[dropQueueFull]); got != 1 {
		t.Fatalf("queue_full drops %v", got)
	}
	first, second := p.b.queue.pop(), p.b.queue.pop()
	if first[28] != 1 || second[28] != 2 || p.b.queue.pop() != nil {
		t.Fatal("the queue did not drop its oldest packet")
	}
}

// TestForwardPathAllocatesNothing: opening, routing, queueing, popping and sealing one packet
// allocates nothing (SPEC §7 data plane; quic-go's own receive and send copies are outside it).
func TestForwardPathAllocatesNothing(t *testing.T) {
	p := newPlane(t, 64)
	const runs = 500
	datagrams := make([][]byte, runs+1)
	for i := range datagrams {
		datagrams[i] = p.fromA(ipv4Packet(addrA, addrB, make([]byte, 1300)))
	}
	i := 0
	allocs := testing.AllocsPerRun(runs, func() {
		p.h.forward(p.a, datagrams[i])
		i++
		q := p.b.queue.pop()
		if _, ok := p.b.seal.seal(q); !ok {
			panic("seal")
		}
	})
	if allocs != 0 {
		t.Fatalf("forward path: %v allocations per packet", allocs)
	}
	if got := testutil.ToFloat64(p.h.m.dropBy[dropQueueFull]) + testutil.ToFloat64(p.h.m.dropBy[dropReplayed]); got != 0 {
		t.Fatalf("%v drops in the allocation run", got)
	}
}

func BenchmarkForwardPath(b *testing.B) {
	p := newPlane(b, 64)
	pkt := ipv4Packet(addrA, addrB, make([]byte, 1372))
	datagrams := make([][]byte, 4096)
	for i := range datagrams {
		datagrams[i] = p.fromA(pkt)
	}
	scratch := make([]byte, len(datagrams[0]))
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Reuse the datagrams with fresh counters so the replay window lets them through.
		d := scratch
		if i < len(datagrams) {
			copy(d, datagrams[i])
		} else {
			b.StopTimer()
			e, _ := p.aSend.seal(pkt)
			copy(d, e)
			b.StartTimer()
		}
		p.h.forward(p.a, d)
		q := p.b.queue.pop()
		p.b.seal.seal(q)
	}
}

func TestMetricNames(t *testing.T) {
	want := map[string]dto.MetricType{
		"relay_vpnhub_members": dto.MetricType_GAUGE, "relay_vpnhub_sessions": dto.MetricType_GAUGE,
		"relay_vpnhub_membership_generation": dto.MetricType_GAUGE,
		"relay_vpnhub_handshakes_total":      dto.MetricType_COUNTER, "relay_vpnhub_forwarded_packets_total": dto.MetricType_COUNTER,
		"relay_vpnhub_forwarded_bytes_total": dto.MetricType_COUNTER, "relay_vpnhub_dropped_packets_total": dto.MetricType_COUNTER,
		"relay_vpnhub_session_closes_total": dto.MetricType_COUNTER,
	}
	reg := prometheus.NewRegistry()
	if err := NewMetrics().Register(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]bool{}
	for _, mf := range mfs {
		typ, ok := want[mf.GetName()]
		switch {
		case !ok:
			t.Errorf("unexpected metric %q", mf.GetName())
		case typ != mf.GetType():
			t.Errorf("%s is a %v", mf.GetName(), mf.GetType())
		case typ == dto.MetricType_COUNTER && !strings.HasSuffix(mf.GetName(), "_total"):
			t.Errorf("counter %s does not end in _total", mf.GetName())
		}
		delete(want, mf.GetName())
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[mf.GetName()+"{"+l.GetName()+"="+l.GetValue()+"}"] = true
			}
		}
	}
	for n := range want {
		t.Errorf("metric %q missing", n)
	}
	for _, r := range []string{"spoofed", "replayed", "unknown_destination", "not_unicast", "queue_full", "receive_queue_full", "too_large", "expired", "malformed", "unauthenticated"} {
		if !labels["relay_vpnhub_dropped_packets_total{reason="+r+"}"] {
			t.Errorf("drop reason %q missing", r)
		}
	}
	for _, o := range []string{"accepted", "rate-limited", "broken", "vpn-member-unknown", "vpn-member-expired", "vpn-member-node-mismatch", "vpn-authority-mismatch"} {
		if !labels["relay_vpnhub_handshakes_total{outcome="+o+"}"] {
			t.Errorf("handshake outcome %q missing", o)
		}
	}
	for _, r := range []string{"vpn-member-removed", "vpn-member-replaced", "vpn-member-expired", "left", "shutdown"} {
		if !labels["relay_vpnhub_session_closes_total{reason="+r+"}"] {
			t.Errorf("close reason %q missing", r)
		}
	}
}
