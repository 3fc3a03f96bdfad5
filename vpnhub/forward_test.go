package vpnhub

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/vpnhub/internal/wire"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// plane is the hub's data plane without sockets: two sessions with their keys, no QUIC.
type plane struct {
	h          *Hub
	a, b       *session
	aSend      *wire.Sealer // a's client side: seals what a sends
	bOpen      *wire.Opener // b's client side: opens what the hub sends b
	queueLimit int
}

func newPlane(t testing.TB, queueLen int) *plane {
	clock := newFakeClock(testNow)
	h := &Hub{cfg: Config{QueueLen: queueLen}, log: zerolog.Nop(), m: newMetrics(), clock: clock,
		sessions: map[[32]byte]*session{}, routes: map[uint32]*session{}}
	ka, kb := testKey(t, 2), testKey(t, 3)
	h.view.Store(testView(testMember(ka, "node-a", 2), testMember(kb, "node-b", 3)))
	mk := func(k vpnkey.Pair, node string, last byte, keys wire.TransportKeys) *session {
		acc := accepted{keys: keys, member: testMember(k, node, last), authority: testAuthority}
		s := &session{hub: h, member: acc.member, authority: acc.authority, addr: wire.AddrU32(acc.member.ControlAddress), mtu: 1400,
			queue: newPacketQueue(queueLen), open: wire.NewOpener(keys.Recv), seal: wire.NewSealer(keys.Send, 1400)}
		s.expiresAt.Store(acc.member.ExpiresAt)
		h.sessions[k.Public] = s
		h.routes[s.addr] = s
		return s
	}
	p := &plane{h: h}
	p.a = mk(ka, "node-a", 2, wire.TransportKeys{Send: [32]byte{1}, Recv: [32]byte{2}})
	p.b = mk(kb, "node-b", 3, wire.TransportKeys{Send: [32]byte{3}, Recv: [32]byte{4}})
	p.aSend = wire.NewSealer([32]byte{2}, 1400)
	p.bOpen = wire.NewOpener([32]byte{3})
	return p
}

// fromA seals packet as node-a's client would and returns a fresh datagram.
func (p *plane) fromA(packet []byte) []byte {
	d, _ := p.aSend.Seal(packet)
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
	d, _ := p.b.seal.Seal(q)
	got, verdict := p.bOpen.Open(bytes.Clone(d))
	if verdict != wire.Opened || !bytes.Equal(got, pkt) {
		t.Fatalf("b's client opened %q (%v)", got, verdict)
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
// allocates nothing (docs/protocol.md#vpn-hub data plane; quic-go's own receive and send copies are outside it).
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
		if _, ok := p.b.seal.Seal(q); !ok {
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
			e, _ := p.aSend.Seal(pkt)
			copy(d, e)
			b.StartTimer()
		}
		p.h.forward(p.a, d)
		q := p.b.queue.pop()
		p.b.seal.Seal(q)
	}
}

// An empty packet is a keep-alive (docs/protocol.md#vpn-hub): it proves the session live, is counted, and goes
// nowhere.
func TestForwardTakesAnEmptyPacketAsKeepAlive(t *testing.T) {
	p := newPlane(t, 8)
	if p.a.live.Load() {
		t.Fatal("live before any datagram")
	}
	p.h.forward(p.a, p.fromA(nil))
	if !p.a.live.Load() || testutil.ToFloat64(p.h.m.keepAlives) != 1 {
		t.Fatal("a keep-alive did not count as liveness")
	}
	if p.b.queue.len() != 0 || testutil.ToFloat64(p.h.m.packets) != 0 || testutil.ToFloat64(p.h.m.drops.WithLabelValues("malformed")) != 0 {
		t.Fatal("a keep-alive was forwarded or dropped")
	}
	// A datagram that does not authenticate proves nothing.
	q := newPlane(t, 8)
	q.h.forward(q.a, make([]byte, 40))
	if q.a.live.Load() {
		t.Fatal("an unauthenticated datagram counted as liveness")
	}
}
