package client

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/backoff"
	"code.foss.global/serve.zone/relay/vpnhub/internal/wire"
)

// runTunnel runs a Tunnel for cl over a memDevice until the test ends; joins receives each
// session.
func runTunnel(t *testing.T, cl *Client) (*Tunnel, *memDevice, chan *Conn) {
	t.Helper()
	dev := newMemDevice()
	joins := make(chan *Conn, 8)
	tu := &Tunnel{Client: cl, Device: dev, Logger: testLogger(t), OnJoin: func(c *Conn) { joins <- c }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tu.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("tunnel ended with %v", err)
		}
	})
	return tu, dev, joins
}

func joined(t *testing.T, joins chan *Conn, within time.Duration) *Conn {
	t.Helper()
	select {
	case c := <-joins:
		return c
	case <-time.After(within):
		t.Fatal("the tunnel did not join")
		return nil
	}
}

func TestTunnelCarriesPacketsAndRejoinsAfterRemoval(t *testing.T) {
	checkLeaks(t)
	ka, kb := testKey(t, 2), testKey(t, 3)
	th := startHub(t, testMember(ka, "node-a", 2), testMember(kb, "node-b", 3))
	b := th.dial(t, kb, "node-b")
	tu, dev, joins := runTunnel(t, th.client(t, ka, "node-a", netip.AddrPort{}, nil))
	joined(t, joins, 15*time.Second)

	dev.in <- ipv4Packet(addrA, addrB, []byte("through the tunnel"))
	if got := receiveWithin(b, 5*time.Second); got == nil {
		t.Fatal("b received nothing from the tunnel")
	}
	dev.in <- ipv4Packet(addrB, addrB, []byte("not my address")) // dropped at the tunnel
	b.WritePacket(ipv4Packet(addrB, addrA, []byte("to the tunnel")))
	if p := dev.next(t); !bytes.Contains(p, []byte("to the tunnel")) {
		t.Fatalf("device got %q", p)
	}
	refusedBefore := refusedHandshakes(t, th)
	th.push(t, 2, testMember(kb, "node-b", 3)) // a removed: its session closes, redials are refused
	eventually(t, "node-a's redial refused", func() bool { return refusedHandshakes(t, th) > refusedBefore })
	th.push(t, 3, testMember(ka, "node-a", 2), testMember(kb, "node-b", 3))
	joined(t, joins, 35*time.Second)
	if tu.Dropped() < 1 || tu.Sent() < 1 || tu.Received() < 1 {
		t.Fatalf("sent %d received %d dropped %d", tu.Sent(), tu.Received(), tu.Dropped())
	}
}

// docs/protocol.md#vpn-hub: a client treats every refusal, vpn-member-replaced included, as a reason to redial
// with backoff, never to stop. Here the hub really replaced the tunnel's session: the tunnel takes
// its key back.
func TestTunnelRedialsAfterBeingReplaced(t *testing.T) {
	ka := testKey(t, 2)
	th := startHub(t, testMember(ka, "node-a", 2))
	tu, _, joins := runTunnel(t, th.client(t, ka, "node-a", netip.AddrPort{}, nil))
	first := joined(t, joins, 15*time.Second)
	th.dial(t, ka, "node-a") // another session of a's key
	<-first.Done()
	if err := first.Err(); !errors.Is(err, contracts.VPNMemberReplaced) {
		t.Fatalf("the first session ended with %v", err)
	}
	joined(t, joins, 15*time.Second)
	if got := tu.Joins(); got != 2 {
		t.Fatalf("%d joins", got)
	}
}

// impersonator answers every QUIC connection as a hub would, up to message 1, and then closes it
// with the refusal vpn-member-replaced: the reason phrase of a QUIC close is not authenticated by
// Noise, so anyone on the path who terminates QUIC can send it.
func impersonator(t *testing.T) (netip.AddrPort, *atomic.Int64) {
	t.Helper()
	tlsConf, err := wire.HubTLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: udp}
	ln, err := tr.Listen(tlsConf, &quic.Config{EnableDatagrams: true})
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			qc, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				if st, err := qc.AcceptStream(ctx); err == nil {
					wire.ReadFrame(st, wire.MaxHandshakeMessage)
				}
				qc.CloseWithError(contracts.VPNCloseCodeRefused, wire.CloseReason(contracts.VPNMemberReplaced.Refuse("forged on the path")))
			}()
		}
	}()
	t.Cleanup(func() { cancel(); ln.Close(); tr.Close(); udp.Close(); <-done })
	return netip.MustParseAddrPort(udp.LocalAddr().String()), &conns
}

// A forged vpn-member-replaced close must not stop the tunnel: it redials, by the backoff schedule
// rather than at once — each redial only once the wait the schedule drew is over, the waits' ceiling
// doubling from 250 ms (never started again, as a session that lasted would start it) — and joins
// the real hub when the path lets it through again. The tunnel's clock is the test's.
func TestTunnelRedialsAfterAForgedReplacedClose(t *testing.T) {
	checkLeaks(t)
	ka := testKey(t, 2)
	th := startHub(t, testMember(ka, "node-a", 2))
	forger, forged := impersonator(t)
	path := newUDPProxy(t, forger)
	clk := newHandClock()
	tu, _, joins := runTunnel(t, th.client(t, ka, "node-a", path.addr(), func(c *Config) { c.Clock = clk }))
	const rounds = 7
	var waits []time.Duration
	var wait *handTimer
	for k := range rounds {
		wait = clk.timer(t)
		if n := forged.Load(); n != int64(k+1) {
			t.Fatalf("%d dials before the wait after forged close %d was over", n, k+1)
		}
		if ceiling := backoff.Base << k; wait.d > ceiling {
			t.Fatalf("wait %d drawn %s, past the schedule's ceiling %s", k+1, wait.d, ceiling)
		}
		waits = append(waits, wait.d)
		if k < rounds-1 {
			wait.fire()
		}
	}
	// Full jitter: a wait may be short by chance, but with the schedule started again after each
	// close every one would be under its first ceiling; with the ceilings doubling, all of the last
	// five are that short about once in a million runs.
	if slices.IndexFunc(waits[2:], func(d time.Duration) bool { return d > backoff.Base }) < 0 {
		t.Fatalf("waits %v: none past %s, the schedule was started again", waits, backoff.Base)
	}
	path.switchTo(th.Addr())
	wait.fire()
	joined(t, joins, 35*time.Second)
	if tu.Joins() != 1 || forged.Load() != rounds {
		t.Fatalf("%d joins, %d forged closes", tu.Joins(), forged.Load())
	}
}

// docs/protocol.md#vpn-hub: a client sends an empty keep-alive datagram right after the handshake
// and whenever it sent nothing for an interval, and none while it sends packets anyway. The
// keep-alive cadence runs on the test's clock: a tick is half an interval.
func TestConnSendsKeepAlivesWhileIdle(t *testing.T) {
	checkLeaks(t)
	ka, kb := testKey(t, 2), testKey(t, 3)
	th := startHub(t, testMember(ka, "node-a", 2), testMember(kb, "node-b", 3))
	b := th.dial(t, kb, "node-b") // on the wall clock at 10 s: a keep-alive after its handshake only
	defer b.Close()
	const interval = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	clk := newHandClock()
	a, err := th.client(t, ka, "node-a", netip.AddrPort{}, func(c *Config) { c.KeepAliveInterval = interval; c.Clock = clk }).Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// Before any tick: right after the handshakes.
	eventually(t, "the keep-alives right after the handshakes", func() bool { return th.metric(t, "relay_vpnhub_keepalives_total") >= 2 })
	keepAlives := func(from float64, want int) {
		t.Helper()
		eventually(t, "the keep-alives", func() bool { return th.metric(t, "relay_vpnhub_keepalives_total")-from >= float64(want) })
		if got := th.metric(t, "relay_vpnhub_keepalives_total") - from; got != float64(want) {
			t.Fatalf("%v keep-alives, want %d", got, want)
		}
	}
	base := th.metric(t, "relay_vpnhub_keepalives_total")
	for i := 1; i <= 10; i++ { // idle: one per interval
		clk.tick(t, nil)
		clk.tick(t, nil)
		keepAlives(base, i)
	}
	base = th.metric(t, "relay_vpnhub_keepalives_total")
	const busy = 20
	for range busy { // a packet before every tick: none
		clk.tick(t, func() {
			if err := a.WritePacket(ipv4Packet(addrA, addrB, []byte("busy"))); err != nil {
				t.Fatal(err)
			}
		})
	}
	clk.tick(t, nil) // nothing sent since the last tick: one, the first since the packets
	keepAlives(base, 1)
	eventually(t, "the busy packets forwarded", func() bool { return th.metric(t, "relay_vpnhub_forwarded_packets_total") >= busy/2 })
}
