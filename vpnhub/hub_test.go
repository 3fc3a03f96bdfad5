package vpnhub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/vpnhub/client"
	"code.foss.global/serve.zone/relay/vpnhub/internal/wire"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// The hub over the wire: a real hub on loopback, real Go clients, and raw members written from
// internal/wire where a test must replay, forge or stay silent.

type pair struct {
	th     *testHub
	ka, kb vpnkey.Pair
	a, b   *client.Conn
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
		t.Fatalf("forwarded_packets_total = %v, want %d (keep-alives are not forwarded)", f, 2*n)
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
	if err := p.a.WritePacket(make([]byte, p.a.MTU()+1)); !errors.Is(err, client.ErrPacketTooLarge) {
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
	th := startHub(t, nil)
	ka, kb := testKey(t, 2), testKey(t, 3)
	th.push(t, 1, testMember(ka, "node-a", 2), testMember(kb, "node-b", 3))
	b := th.mustDial(t, kb, "node-b")
	a, err := th.dialRaw(t, th.hello(t, ka, "node-a", 1))
	if err != nil {
		t.Fatal(err)
	}
	pkt := ipv4Packet(addrA, addrB, []byte("once"))
	d := a.send(t, pkt)
	a.sendRaw(t, d)
	a.sendRaw(t, d)
	if got := receiveWithin(b, 5*time.Second); !bytes.Equal(got, pkt) {
		t.Fatalf("b received %q", got)
	}
	eventually(t, "two replayed drops", func() bool { return th.drops(dropReplayed) == 2 })
	if got := receiveWithin(b, 200*time.Millisecond); got != nil {
		t.Fatal("b received a replayed packet")
	}
	forged := bytes.Clone(d)
	forged[7], forged[len(forged)-1] = 200, forged[len(forged)-1]^1 // a new counter, a broken tag
	a.sendRaw(t, forged)
	eventually(t, "an unauthenticated drop", func() bool { return th.drops(dropUnauthenticated) == 1 })
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
func refusedDial(t *testing.T, th *testHub, key vpnkey.Pair, node, authority string, want contracts.RefusalName) {
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

// A message 1 seen once (the client verifies no certificate, so
// whoever sits on the path can read it inside QUIC) can be sent again later from anywhere. Its
// timestamp is not newer than the one the hub accepted for the key, so the hub refuses it
// (vpn-handshake-replayed) and the member's live session stays.
func TestReplayedMessage1DoesNotDisconnectTheMember(t *testing.T) {
	th := startHub(t, nil)
	k := testKey(t, 2)
	th.push(t, 1, testMember(k, "node-a", 2))
	earlier := th.hello(t, k, "node-a", time.Now().UnixMicro()) // an earlier session's message 1
	current := th.hello(t, k, "node-a", time.Now().UnixMicro()+1)
	live, err := th.dialRaw(t, current)
	if err != nil {
		t.Fatal(err)
	}
	live.send(t, nil) // a keep-alive, as the client sends
	for what, m := range map[string]message1{"the live session's own message 1": current, "an earlier message 1": earlier} {
		before := th.handshakes(string(contracts.VPNHandshakeReplayed))
		replayer, err := th.dialRaw(t, message1{bytes: m.bytes}) // a replayer has the bytes, not the initiator's state
		if replayer != nil || !errors.Is(err, contracts.VPNHandshakeReplayed) {
			t.Fatalf("%s replayed: %v; want vpn-handshake-replayed", what, err)
		}
		if got := th.handshakes(string(contracts.VPNHandshakeReplayed)); got != before+1 {
			t.Fatalf("%s: handshakes_total{outcome=vpn-handshake-replayed} went %v -> %v", what, before, got)
		}
		select {
		case <-live.qc.Context().Done():
			t.Fatalf("%s replayed closed the member's live session: %v", what, context.Cause(live.qc.Context()))
		case <-time.After(100 * time.Millisecond):
		}
	}
	if got := th.closes(string(contracts.VPNMemberReplaced)); got != 0 {
		t.Fatalf("session_closes_total{vpn-member-replaced} = %v", got)
	}
}

// docs/protocol.md#vpn-hub: the hub keeps, per member key, the greatest timestamp it accepted and refuses a message
// 1 whose timestamp is not greater; a newer one replaces the live session.
func TestHandshakeTimestampMustGrow(t *testing.T) {
	th := startHub(t, nil)
	k := testKey(t, 2)
	th.push(t, 1, testMember(k, "node-a", 2))
	first, err := th.dialRaw(t, th.hello(t, k, "node-a", 1000))
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range []int64{1000, 999, 0} {
		if _, err := th.dialRaw(t, th.hello(t, k, "node-a", ts)); !errors.Is(err, contracts.VPNHandshakeReplayed) {
			t.Fatalf("timestamp %d after 1000: %v; want vpn-handshake-replayed", ts, err)
		}
	}
	if _, err := th.dialRaw(t, th.hello(t, k, "node-a", 1001)); err != nil {
		t.Fatalf("a newer timestamp: %v", err)
	}
	if err := first.ended(t); !errors.Is(err, contracts.VPNMemberReplaced) {
		t.Fatalf("the older session ended with %v; want vpn-member-replaced", err)
	}
	// A key that leaves the membership starts afresh when it comes back.
	th.push(t, 2)
	th.push(t, 3, testMember(k, "node-a", 2))
	if _, err := th.dialRaw(t, th.hello(t, k, "node-a", 5)); err != nil {
		t.Fatalf("a key that left and came back: %v", err)
	}
}

// docs/protocol.md#vpn-hub: a session that has delivered no authenticated datagram within 15 s of its handshake is
// closed (vpn-session-silent): a session opened by a replayed message 1, which can never send
// one, ends instead of being held up by the hub's own QUIC keep-alives. An empty datagram is
// liveness enough and is forwarded nowhere.
func TestSilentSessionIsClosed(t *testing.T) {
	th := startHub(t, nil)
	ks, kl := testKey(t, 2), testKey(t, 3)
	th.push(t, 1, testMember(ks, "node-a", 2), testMember(kl, "node-b", 3))
	silent, err := th.dialRaw(t, th.hello(t, ks, "node-a", 1))
	if err != nil {
		t.Fatal(err)
	}
	speaking, err := th.dialRaw(t, th.hello(t, kl, "node-b", 1))
	if err != nil {
		t.Fatal(err)
	}
	speaking.send(t, nil)
	eventually(t, "the keep-alive", func() bool { return th.live(kl) })
	th.clock.Advance(contracts.VPNSilentTimeout - time.Millisecond)
	select {
	case <-silent.qc.Context().Done():
		t.Fatal("closed before the silence timeout")
	case <-time.After(50 * time.Millisecond):
	}
	th.clock.Advance(time.Millisecond)
	if err := silent.ended(t); !errors.Is(err, contracts.VPNSessionSilent) {
		t.Fatalf("the silent session ended with %v; want vpn-session-silent", err)
	}
	if got := th.closes(string(contracts.VPNSessionSilent)); got != 1 {
		t.Fatalf("session_closes_total{vpn-session-silent} = %v", got)
	}
	th.clock.Advance(30 * time.Second) // still before the members expire
	select {
	case <-speaking.qc.Context().Done():
		t.Fatalf("a session that sent a keep-alive was closed: %v", context.Cause(speaking.qc.Context()))
	case <-time.After(50 * time.Millisecond):
	}
	if ka, fwd := testutil.ToFloat64(th.m.keepAlives), testutil.ToFloat64(th.m.packets); ka != 1 || fwd != 0 {
		t.Fatalf("keepalives_total %v, forwarded_packets_total %v; want 1 and 0", ka, fwd)
	}
}

func TestRemovedMemberIsClosedAtOnce(t *testing.T) {
	p := startPair(t)
	if g := p.th.push(t, 2, testMember(p.ka, "node-a", 2)); g != 2 {
		t.Fatalf("appliedGeneration %d", g)
	}
	if err := waitClosed(t, p.b); !errors.Is(err, contracts.VPNMemberRemoved) {
		t.Fatalf("b's session ended with %v; want vpn-member-removed", err)
	}
	if got := p.th.closes(string(contracts.VPNMemberRemoved)); got != 1 {
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
		t.Fatalf("b closed before its expiry: %v", p.b.Err())
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

// countingClock is the fake clock that counts the timers the hub schedules.
type countingClock struct {
	*fakeClock
	timers atomic.Int64
}

func (c *countingClock) AfterFunc(d time.Duration, f func()) Timer {
	c.timers.Add(1)
	return c.fakeClock.AfterFunc(d, f)
}

// A member whose expiresAt is far in the future (9999-12-31T23:59:59.999Z, a common "never"
// sentinel, and a non-negative safe integer ReadVPNMembershipPush accepts) must not make the
// expiry timer fire again and again: the hub closes a member's session when it passes expiresAt,
// not before, and the hub must not spin meanwhile. The clock moves on a second in steps of 10 ms:
// a timer due within a step fires in it and, spinning, schedules the next one.
func TestFarFutureExpiryDoesNotSpinTheExpiryTimer(t *testing.T) {
	clock := &countingClock{fakeClock: newFakeClock(testNow)}
	th := startHub(t, func(_ *Config, o *Options) { o.Clock = clock })
	k := testKey(t, 2)
	m := testMember(k, "node-a", 2)
	m.ExpiresAt = 253402300799999 // 9999-12-31T23:59:59.999Z
	th.push(t, 1, m)
	c := th.mustDial(t, k, "node-a")
	before := clock.timers.Load()
	for range 100 {
		clock.Advance(10 * time.Millisecond)
	}
	if n := clock.timers.Load() - before; n > 2 {
		t.Fatalf("the hub scheduled %d expiry timers in a second for one member expiring in the year 9999", n)
	}
	select {
	case <-c.Done():
		t.Fatalf("session ended: %v", c.Err())
	default:
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
		ControlPrefix: testPrefix, Generation: 5,
		Members: []contracts.VPNMember{testMember(p.ka, "node-a", 2), testMember(p.kb, "node-b", 3)}})
	if _, err := p.th.PushMembership(body); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*client.Conn{p.a, p.b} {
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
	var ref *contracts.Refusal
	if err := waitClosed(t, c); err == nil || errors.As(err, &ref) {
		t.Fatalf("session ended with %v; want an ordinary close", err)
	}
}

func TestHandshakeFloodIsRateLimitedAndMembersKeepForwarding(t *testing.T) {
	th := startHub(t, func(c *Config, _ *Options) { c.HandshakeBurst = 0 }) // WireGuard's 20/s, burst 5; the clock stands still
	ka, kb, stranger := testKey(t, 2), testKey(t, 3), testKey(t, 9)
	th.push(t, 1, testMember(ka, "node-a", 2), testMember(kb, "node-b", 3))
	a := th.mustDial(t, ka, "node-a")
	b := th.mustDial(t, kb, "node-b")
	// The rest of 127.0.0.1's burst of 5 is refused by name, then the QUIC connection is refused.
	// The burst counts Initial packets, and a loaded machine retransmits some, so the flood
	// reaches the limit after at most three more handshakes, not exactly three.
	var ref *contracts.Refusal
	for i := 0; ; i++ {
		_, err := th.dial(t, stranger, "node-x", testAuthority)
		if err != nil && !errors.As(err, &ref) && strings.Contains(err.Error(), "CONNECTION_REFUSED") {
			break
		}
		if i == 3 || !errors.Is(err, contracts.VPNMemberUnknown) {
			t.Fatalf("handshake %d of a stranger in an instant: %v; want vpn-member-unknown until the QUIC connection is refused", i+3, err)
		}
	}
	// Counted per refused Initial packet: a ClientHello may span two.
	if got := th.handshakes(outcomeRateLimited); got < 1 {
		t.Fatalf("handshakes_total{outcome=rate-limited} = %v", got)
	}
	a.WritePacket(ipv4Packet(addrA, addrB, []byte("still here")))
	if receiveWithin(b, 5*time.Second) == nil {
		t.Fatal("established members stopped forwarding under a handshake flood")
	}
	// The whole burst back (20 per second): not one token, because a late Initial of the flood
	// (the second packet of a ClientHello, a retransmission on a loaded machine) may take one first.
	th.clock.Advance(250 * time.Millisecond)
	refusedDial(t, th, stranger, "node-x", testAuthority, contracts.VPNMemberUnknown)
}

// dialFrom dials th from a UDP socket bound to ip, as node with key, and closes what it opened.
func dialFrom(t *testing.T, th *testHub, ip string, key vpnkey.Pair, node string) error {
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(ip)})
	if err != nil {
		t.Error(err)
		return err
	}
	defer udp.Close()
	cl, err := client.New(client.Config{Hub: th.Addr(), HubKey: th.key.Public, AuthorityID: testAuthority, NodeID: node, Key: key, Conn: udp})
	if err != nil {
		t.Error(err)
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := cl.Dial(ctx)
	if err == nil {
		c.Close()
	}
	return err
}

// docs/protocol.md#vpn-hub: "Handshakes are rate-limited per source address, never more strictly than WireGuard's
// 20 per second with a burst of 5, so a flood of bogus initiations cannot starve members." Bogus
// initiators that each stay inside their own source's limit (one handshake each) must not get a
// member refused whose source has not handshaken at all. The hub's extra global bucket does: at
// its defaults (500/s, burst 100) that takes a flood of more than 500 handshakes a second, which
// this shared test machine cannot produce, so the test lowers it to 10/s, burst 10; the mechanism
// is the same.
func TestBogusSourcesWithinTheirOwnLimitDoNotStarveAMember(t *testing.T) {
	th := startHub(t, func(c *Config, o *Options) {
		o.Clock = wallClock{}
		c.HandshakeBurst = 0
		c.GlobalHandshakeRate, c.GlobalHandshakeBurst = 10, 10
	})
	member, stranger := testKey(t, 2), testKey(t, 9)
	m := testMember(member, "node-a", 2)
	m.ExpiresAt = time.Now().Add(time.Hour).UnixMilli()
	th.push(t, 1, m)
	for i := 0; i < 20; i++ { // 20 sources, one handshake each
		dialFrom(t, th, fmt.Sprintf("127.0.1.%d", 10+i), stranger, "node-x")
	}
	err := dialFrom(t, th, "127.0.2.1", member, "node-a")
	if err != nil {
		t.Fatalf("a member's first handshake from its own address was refused: %v", err)
	}
	if unknown, limited := th.handshakes("vpn-member-unknown"), th.handshakes(outcomeRateLimited); unknown != 20 || limited != 0 {
		t.Fatalf("20 strangers inside their own limits: %v refused vpn-member-unknown, %v rate-limited; want 20 and 0", unknown, limited)
	}
}

// dialQUIC completes a QUIC handshake with the hub and sends no message 1: a handshake the hub
// holds in progress until its Noise stage times out or the connection closes.
func dialQUIC(t *testing.T, th *testHub) (*quic.Conn, error) {
	t.Helper()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: udp}
	t.Cleanup(func() { tr.Close(); udp.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return tr.Dial(ctx, net.UDPAddrFromAddrPort(th.Addr()), wire.ClientTLSConfig(), &quic.Config{EnableDatagrams: true})
}

// A flood keeps handshakes in progress, not just starts them: each costs the hub goroutines of
// QUIC, TLS and Noise work, which the Go scheduler serves alike with the members' packets. So no
// more than MaxHandshakes are in progress at once: one more is refused at QUIC's first packet
// (CONNECTION_REFUSED, counted busy), while established members' packets flow as before; a slot
// is held from the first packet until message 1 is judged (the members that joined hold none) or
// the connection ends, and is then free for a member to join.
func TestHandshakesInProgressAreBounded(t *testing.T) {
	checkLeaks(t)
	th := startHub(t, func(c *Config, _ *Options) { c.MaxHandshakes, c.HandshakeTimeout = 2, time.Minute })
	kc := testKey(t, 4)
	th.push(t, 1, testMember(testKey(t, 2), "node-a", 2), testMember(testKey(t, 3), "node-b", 3), testMember(kc, "node-c", 4))
	a, b := th.mustDial(t, testKey(t, 2), "node-a"), th.mustDial(t, testKey(t, 3), "node-b")

	var held []*quic.Conn
	for range 2 {
		qc, err := dialQUIC(t, th)
		if err != nil {
			t.Fatalf("a handshake within MaxHandshakes, beside two members' sessions: %v", err)
		}
		held = append(held, qc)
	}
	_, err := th.dial(t, kc, "node-c", testAuthority)
	var te *quic.TransportError
	if !errors.As(err, &te) || te.ErrorCode != quic.ConnectionRefused || !te.Remote {
		t.Fatalf("a handshake beyond MaxHandshakes in progress: %v; want the hub's CONNECTION_REFUSED", err)
	}
	if busy := th.handshakes(outcomeBusy); busy < 1 { // per Initial packet, as rate-limited is
		t.Fatalf("handshakes busy = %v, want at least 1", busy)
	}
	if err := a.WritePacket(ipv4Packet(addrA, addrB, []byte("while busy"))); err != nil {
		t.Fatal(err)
	}
	if got := receiveWithin(b, 10*time.Second); !bytes.Equal(got, ipv4Packet(addrA, addrB, []byte("while busy"))) {
		t.Fatalf("a member's packet while the handshake slots are taken: b received %q", got)
	}

	// The close is one packet, never sent again: when a busy machine loses it, the hub sees the
	// connection end at its idle timeout instead. So wait past that timeout; a slot that leaked
	// is never freed.
	freed := func(what string, cond func() bool) {
		t.Helper()
		if !await.Within(3*th.cfg.IdleTimeout, cond) {
			t.Fatalf("%s: not within three idle timeouts (%s)", what, 3*th.cfg.IdleTimeout)
		}
	}
	held[0].CloseWithError(0, "")
	freed("the closed handshake's slot is free", func() bool { return len(th.slots) < 2 })
	c, err := th.dial(t, kc, "node-c", testAuthority)
	if err != nil {
		t.Fatalf("a member's handshake once a slot is free: %v", err)
	}
	c.Close()
	held[1].CloseWithError(0, "")
	freed("every slot is free", func() bool { return len(th.slots) == 0 })
}
