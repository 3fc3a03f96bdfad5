package vpnhub

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"code.foss.global/serve.zone/relay/contracts"
)

// Loopback integration: a real hub and real clients over QUIC on 127.0.0.1.

var (
	addrA = netip.MustParseAddr("10.64.0.2")
	addrB = netip.MustParseAddr("10.64.0.3")
)

type pair struct {
	th     *testHub
	ka, kb StaticKey
	a, b   *Conn
}

func startPair(t *testing.T) *pair {
	t.Helper()
	th := startHub(t, nil)
	p := &pair{th: th, ka: testKey(t, 2), kb: testKey(t, 3)}
	th.push(t, 1, testMember(p.ka, "node-a", 2), testMember(p.kb, "node-b", 3))
	p.a = th.mustDial(t, p.ka, "node-a")
	p.b = th.mustDial(t, p.kb, "node-b")
	return p
}

func TestTwoMembersExchangePacketsThroughTheHub(t *testing.T) {
	checkLeaks(t)
	p := startPair(t)
	if p.a.ControlAddress() != addrA || p.b.ControlAddress() != addrB {
		t.Fatalf("control addresses %s %s", p.a.ControlAddress(), p.b.ControlAddress())
	}
	if p.a.MTU() < 1150 || p.a.MTU() > 1300 {
		t.Fatalf("mtu %d; quic-go's 1280-byte packets should carry about 1200", p.a.MTU())
	}
	const n = 50
	for i := 0; i < n; i++ {
		if err := p.a.WritePacket(ipv4Packet(addrA, addrB, []byte(fmt.Sprintf("a->b %d", i)))); err != nil {
			t.Fatal(err)
		}
		got := receiveWithin(p.b, 5*time.Second)
		if !bytes.Equal(got, ipv4Packet(addrA, addrB, []byte(fmt.Sprintf("a->b %d", i)))) {
			t.Fatalf("b received %q", got)
		}
		if err := p.b.WritePacket(ipv4Packet(addrB, addrA, []byte("b->a"))); err != nil {
			t.Fatal(err)
		}
		if got := receiveWithin(p.a, 5*time.Second); got == nil {
			t.Fatal("a received nothing")
		}
	}
	if f := testutil.ToFloat64(p.th.m.packets); f != 2*n {
		t.Fatalf("forwarded_packets_total = %v, want %d", f, 2*n)
	}
	if got := testutil.ToFloat64(p.th.m.sessions); got != 2 {
		t.Fatalf("sessions = %v", got)
	}
	big := ipv4Packet(addrA, addrB, make([]byte, p.a.MTU()-28))
	if err := p.a.WritePacket(big); err != nil {
		t.Fatalf("a packet of exactly the mtu: %v", err)
	}
	if got := receiveWithin(p.b, 5*time.Second); len(got) != p.a.MTU() {
		t.Fatalf("mtu-sized packet arrived as %d bytes", len(got))
	}
	if err := p.a.WritePacket(make([]byte, p.a.MTU()+1)); !errors.Is(err, ErrPacketTooLarge) {
		t.Fatalf("oversized packet: %v", err)
	}
	p.a.Close()
	p.b.Close()
	eventually(t, "sessions to end", func() bool { return testutil.ToFloat64(p.th.m.sessions) == 0 })
}

func TestSpoofedSourceIsDroppedAndCounted(t *testing.T) {
	p := startPair(t)
	before := p.th.drops(dropSpoofed)
	p.a.WritePacket(ipv4Packet(addrB, addrB, []byte("pretending to be b"))) // a's session, b's address
	p.a.WritePacket(ipv4Packet(netip.MustParseAddr("10.64.0.99"), addrB, []byte("an address of nobody")))
	eventually(t, "two spoofed drops", func() bool { return p.th.drops(dropSpoofed) == before+2 })
	if got := receiveWithin(p.b, 200*time.Millisecond); got != nil {
		t.Fatalf("b received a spoofed packet: %q", got)
	}
}

func TestReplayedDatagramIsDroppedAndCounted(t *testing.T) {
	p := startPair(t)
	pkt := ipv4Packet(addrA, addrB, []byte("once"))
	p.a.sendMu.Lock()
	d, _ := p.a.seal.seal(pkt)
	datagram := bytes.Clone(d)
	p.a.sendMu.Unlock()
	for i := 0; i < 3; i++ {
		if err := p.a.writeRaw(datagram); err != nil {
			t.Fatal(err)
		}
	}
	if got := receiveWithin(p.b, 5*time.Second); !bytes.Equal(got, pkt) {
		t.Fatalf("b received %q", got)
	}
	eventually(t, "two replayed drops", func() bool { return p.th.drops(dropReplayed) == 2 })
	if got := receiveWithin(p.b, 200*time.Millisecond); got != nil {
		t.Fatal("b received a replayed packet")
	}
	forged := bytes.Clone(datagram)
	forged[7], forged[len(forged)-1] = 200, forged[len(forged)-1]^1 // a new counter, a broken tag
	p.a.writeRaw(forged)
	eventually(t, "an unauthenticated drop", func() bool { return p.th.drops(dropUnauthenticated) == 1 })
}

func TestUnknownBroadcastAndMulticastDestinationsAreDropped(t *testing.T) {
	p := startPair(t)
	for _, dst := range []string{"10.64.0.77", "10.99.0.1"} {
		p.a.WritePacket(ipv4Packet(addrA, netip.MustParseAddr(dst), []byte("x")))
	}
	for _, dst := range []string{"10.64.0.255", "255.255.255.255", "224.0.0.251", "239.1.2.3"} {
		p.a.WritePacket(ipv4Packet(addrA, netip.MustParseAddr(dst), []byte("x")))
	}
	p.a.WritePacket([]byte{0x60, 0, 0, 0, 0, 0, 0, 0}) // IPv6, or anything that is not IPv4
	eventually(t, "drops", func() bool {
		return p.th.drops(dropUnknownDest) == 2 && p.th.drops(dropNotUnicast) == 4 && p.th.drops(dropMalformed) == 1
	})
	if got := receiveWithin(p.b, 200*time.Millisecond); got != nil {
		t.Fatalf("b received %q", got)
	}
}

// refusedDial dials and checks the hub refused it by name, with a matching metric.
func refusedDial(t *testing.T, th *testHub, key StaticKey, node, authority string, want contracts.RefusalName) {
	t.Helper()
	before := th.handshakes(string(want))
	_, err := th.dial(t, key, node, authority)
	var ref *contracts.Refusal
	if !errors.As(err, &ref) || !errors.Is(err, want) || !strings.HasPrefix(ref.Error(), string(want)+": ") {
		t.Fatalf("dial as %s: %v; want refusal %s", node, err, want)
	}
	if got := th.handshakes(string(want)); got != before+1 {
		t.Fatalf("handshakes_total{outcome=%q} went %v -> %v", want, before, got)
	}
}

func TestHandshakeRefusalsOverTheWire(t *testing.T) {
	th := startHub(t, nil)
	ka, kb, stranger := testKey(t, 2), testKey(t, 3), testKey(t, 9)
	refusedDial(t, th, ka, "node-a", testAuthority, contracts.VPNMemberUnknown) // no membership yet
	expired := testMember(kb, "node-b", 3)
	expired.ExpiresAt = testNow - 1
	th.push(t, 1, testMember(ka, "node-a", 2), expired)
	refusedDial(t, th, stranger, "node-x", testAuthority, contracts.VPNMemberUnknown)
	refusedDial(t, th, ka, "node-b", testAuthority, contracts.VPNMemberNodeMismatch)
	refusedDial(t, th, kb, "node-b", testAuthority, contracts.VPNMemberExpired)
	refusedDial(t, th, ka, "node-a", "authority-2", contracts.VPNAuthorityMismatch)
	if th.handshakes(outcomeAccepted) != 0 || testutil.ToFloat64(th.m.sessions) != 0 {
		t.Fatal("a refused handshake made a session")
	}
	th.mustDial(t, ka, "node-a")
}

func TestRemovedMemberIsClosedAtOnce(t *testing.T) {
	p := startPair(t)
	if g := p.th.push(t, 2, testMember(p.ka, "node-a", 2)); g != 2 {
		t.Fatalf("appliedGeneration %d", g)
	}
	if err := waitClosed(t, p.b); !errors.Is(err, contracts.VPNMemberRemoved) {
		t.Fatalf("b's session ended with %v; want vpn-member-removed", err)
	}
	if got := testutil.ToFloat64(p.th.m.closes.WithLabelValues(string(contracts.VPNMemberRemoved))); got != 1 {
		t.Fatalf("session_closes_total{removed} = %v", got)
	}
	p.a.WritePacket(ipv4Packet(addrA, addrB, []byte("to a removed member")))
	eventually(t, "unknown destination drop", func() bool { return p.th.drops(dropUnknownDest) == 1 })
	refusedDial(t, p.th, p.kb, "node-b", testAuthority, contracts.VPNMemberUnknown)
	// An older or equal generation changes nothing and states the one held.
	if g := p.th.push(t, 1, testMember(p.ka, "node-a", 2), testMember(p.kb, "node-b", 3)); g != 2 {
		t.Fatalf("an older push answered appliedGeneration %d", g)
	}
	refusedDial(t, p.th, p.kb, "node-b", testAuthority, contracts.VPNMemberUnknown)
	select {
	case <-p.a.Done():
		t.Fatalf("a's session ended: %v", p.a.Err())
	default:
	}
}

func TestExpiredMemberIsClosedWhenItsTimeComes(t *testing.T) {
	p := startPair(t)
	later := testMember(p.ka, "node-a", 2)
	later.ExpiresAt = testNow + 120_000
	p.th.push(t, 2, later, testMember(p.kb, "node-b", 3)) // a extended, b still at +60 s
	p.th.clock.Advance(59_999 * time.Millisecond)
	select {
	case <-p.b.Done():
		t.Fatal("b closed before its expiry")
	case <-time.After(50 * time.Millisecond):
	}
	p.th.clock.Advance(time.Millisecond)
	if err := waitClosed(t, p.b); !errors.Is(err, contracts.VPNMemberExpired) {
		t.Fatalf("b ended with %v; want vpn-member-expired", err)
	}
	// a's packets to b now find no session; b cannot join again.
	p.a.WritePacket(ipv4Packet(addrA, addrB, []byte("late")))
	eventually(t, "unknown destination drop", func() bool { return p.th.drops(dropUnknownDest) == 1 })
	refusedDial(t, p.th, p.kb, "node-b", testAuthority, contracts.VPNMemberExpired)
	p.th.clock.Advance(60 * time.Second)
	if err := waitClosed(t, p.a); !errors.Is(err, contracts.VPNMemberExpired) {
		t.Fatalf("a ended with %v; want vpn-member-expired at its extended expiry", err)
	}
}

func TestSecondSessionReplacesTheFirst(t *testing.T) {
	p := startPair(t)
	again := p.th.mustDial(t, p.ka, "node-a")
	if err := waitClosed(t, p.a); !errors.Is(err, contracts.VPNMemberReplaced) {
		t.Fatalf("first session ended with %v; want vpn-member-replaced", err)
	}
	p.b.WritePacket(ipv4Packet(addrB, addrA, []byte("to the new session")))
	if got := receiveWithin(again, 5*time.Second); got == nil {
		t.Fatal("the replacing session receives nothing")
	}
	if got := testutil.ToFloat64(p.th.m.sessions); got != 2 {
		t.Fatalf("sessions = %v", got)
	}
}

func TestAuthorityChangeClosesSessions(t *testing.T) {
	p := startPair(t)
	body := contracts.EncodeVPNMembershipPush(contracts.VPNMembership{AuthorityID: "authority-2",
		ControlPrefix: netip.MustParsePrefix("10.64.0.0/24"), Generation: 5,
		Members: []contracts.VPNMember{testMember(p.ka, "node-a", 2), testMember(p.kb, "node-b", 3)}})
	if _, err := p.th.PushMembership(body); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*Conn{p.a, p.b} {
		if err := waitClosed(t, c); !errors.Is(err, contracts.VPNAuthorityMismatch) {
			t.Fatalf("ended with %v; want vpn-authority-mismatch", err)
		}
	}
	if _, err := p.th.dial(t, p.ka, "node-a", "authority-2"); err != nil {
		t.Fatalf("joining under the new authority: %v", err)
	}
}

func TestInvalidMembershipPushIsRefusedByName(t *testing.T) {
	th := startHub(t, nil)
	_, err := th.PushMembership([]byte(`{"authorityId":"a","controlPrefix":"8.8.8.0/24","generation":1,"members":[]}`))
	if !errors.Is(err, contracts.RelayRequestInvalid) || !strings.Contains(err.Error(), "controlPrefix") {
		t.Fatalf("err = %v", err)
	}
	if g := testutil.ToFloat64(th.m.generation); g != -1 {
		t.Fatalf("generation gauge %v after a refused push", g)
	}
}

func TestHubShutdownClosesSessionsAndLeaksNothing(t *testing.T) {
	checkLeaks(t)
	th := startHub(t, nil)
	k := testKey(t, 2)
	th.push(t, 1, testMember(k, "node-a", 2))
	c := th.mustDial(t, k, "node-a")
	th.stop()
	if err := waitClosed(t, c); err == nil || isRefusal(err) {
		t.Fatalf("session ended with %v; want an ordinary close", err)
	}
}

func TestHandshakeFloodIsRateLimitedAndMembersKeepForwarding(t *testing.T) {
	th := startHub(t, func(c *Config) { c.HandshakeBurst = 0 }) // WireGuard's 20/s, burst 5; the clock stands still
	ka, kb, stranger := testKey(t, 2), testKey(t, 3), testKey(t, 9)
	th.push(t, 1, testMember(ka, "node-a", 2), testMember(kb, "node-b", 3))
	a := th.mustDial(t, ka, "node-a")
	b := th.mustDial(t, kb, "node-b")
	for i := 0; i < 3; i++ { // the rest of 127.0.0.1's burst of 5
		refusedDial(t, th, stranger, "node-x", testAuthority, contracts.VPNMemberUnknown)
	}
	if _, err := th.dial(t, stranger, "node-x", testAuthority); err == nil || isRefusal(err) || !strings.Contains(err.Error(), "CONNECTION_REFUSED") {
		t.Fatalf("the sixth handshake in an instant: %v; want the QUIC connection refused", err)
	}
	// Counted per refused Initial packet: a ClientHello may span two.
	if got := th.handshakes(outcomeRateLimited); got < 1 {
		t.Fatalf("handshakes_total{outcome=rate-limited} = %v", got)
	}
	a.WritePacket(ipv4Packet(addrA, addrB, []byte("still here")))
	if receiveWithin(b, 5*time.Second) == nil {
		t.Fatal("established members stopped forwarding under a handshake flood")
	}
	th.clock.Advance(50 * time.Millisecond) // one token back at 20 per second
	refusedDial(t, th, stranger, "node-x", testAuthority, contracts.VPNMemberUnknown)
}
