package client

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
	"code.foss.global/serve.zone/relay/vpnhub/vpntest"
)

// Short names for the shared test fixtures (internal/vpntest).
var (
	testKey    = vpntest.Key
	ipv4Packet = vpntest.IPv4Packet
	checksum   = vpntest.Checksum
	eventually = vpntest.Eventually
	checkLeaks = vpntest.CheckLeaks
	testLogger = vpntest.Logger
	addrA      = vpntest.A
	addrB      = vpntest.B
)

const testAuthority = vpntest.Authority

// testMember is vpntest.Member valid for an hour of wall-clock time: these tests run a real hub.
func testMember(k vpnkey.Pair, node string, last byte) contracts.VPNMember {
	m := vpntest.Member(k, node, last)
	m.ExpiresAt = time.Now().Add(time.Hour).UnixMilli()
	return m
}

// testHub is a real hub on loopback, on the wall clock, with its metrics in reg.
type testHub struct {
	*vpnhub.Hub
	key vpnkey.Pair
	reg *prometheus.Registry
}

func startHub(t *testing.T, members ...contracts.VPNMember) *testHub {
	t.Helper()
	th := &testHub{key: testKey(t, 1), reg: prometheus.NewRegistry()}
	h, err := vpnhub.Listen(vpnhub.Config{Listen: "127.0.0.1:0", Key: th.key}, vpnhub.Options{Logger: testLogger(t), Registerer: th.reg})
	if err != nil {
		t.Fatal(err)
	}
	th.Hub = h
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	th.push(t, 1, members...)
	return th
}

func (th *testHub) push(t *testing.T, generation int64, members ...contracts.VPNMember) {
	t.Helper()
	if _, err := th.PushMembership(vpntest.Membership(generation, members...)); err != nil {
		t.Fatal(err)
	}
}

// client is a Client for node with key, dialling at (the hub's address when invalid).
func (th *testHub) client(t *testing.T, key vpnkey.Pair, node string, at netip.AddrPort, mod func(*Config)) *Client {
	t.Helper()
	if !at.IsValid() {
		at = th.Addr()
	}
	cfg := Config{Hub: at, HubKey: th.key.Public, AuthorityID: testAuthority, NodeID: node, Key: key, Logger: testLogger(t)}
	if mod != nil {
		mod(&cfg)
	}
	cl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func (th *testHub) dial(t *testing.T, key vpnkey.Pair, node string) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := th.client(t, key, node, netip.AddrPort{}, nil).Dial(ctx)
	if err != nil {
		t.Fatalf("dial %s: %v", node, err)
	}
	return c
}

func (th *testHub) metric(t *testing.T, name string) float64 { return gauge(t, th.reg, name) }

// gauge is the value of the unlabelled metric name in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// refusedHandshakes is the hub's count of handshakes it did not accept, whatever the reason.
func refusedHandshakes(t *testing.T, th *testHub) float64 {
	t.Helper()
	mfs, err := th.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "relay_vpnhub_handshakes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() != "accepted" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// receiveWithin returns the next packet c receives within d, or nil.
func receiveWithin(c *Conn, d time.Duration) []byte {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	p, err := c.ReceivePacket(ctx)
	if err != nil {
		return nil
	}
	return p
}

// memDevice is an in-memory Device: tests put packets in and take the tunnel's out.
type memDevice struct {
	in, out chan []byte
	once    sync.Once
	closed  chan struct{}
}

func newMemDevice() *memDevice {
	return &memDevice{in: make(chan []byte, 64), out: make(chan []byte, 64), closed: make(chan struct{})}
}

func (d *memDevice) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	select {
	case p := <-d.in:
		sizes[0] = copy(bufs[0][offset:], p)
		return 1, nil
	case <-d.closed:
		return 0, ErrClosed
	}
}

func (d *memDevice) Write(bufs [][]byte, offset int) (int, error) {
	for _, b := range bufs {
		select {
		case d.out <- bytes.Clone(b[offset:]):
		default:
		}
	}
	return len(bufs), nil
}

func (d *memDevice) BatchSize() int { return 1 }

func (d *memDevice) Close() error { d.once.Do(func() { close(d.closed) }); return nil }

func (d *memDevice) next(t *testing.T) []byte {
	t.Helper()
	select {
	case p := <-d.out:
		return p
	case <-time.After(5 * time.Second):
		t.Fatal("no packet out of the tunnel")
		return nil
	}
}

// udpProxy forwards one client's UDP datagrams to a target that can be switched, and the
// target's answers back: what stands between a node and its hub on the path.
type udpProxy struct {
	pc     *net.UDPConn
	target atomic.Pointer[netip.AddrPort]
	client atomic.Pointer[netip.AddrPort]
	former sync.Map // netip.AddrPort → true: targets switched away from, whose packets go nowhere
}

func newUDPProxy(t *testing.T, target netip.AddrPort) *udpProxy {
	t.Helper()
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	p := &udpProxy{pc: pc}
	p.target.Store(&target)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
			if to := p.target.Load(); from == *to {
				if c := p.client.Load(); c != nil {
					pc.WriteToUDPAddrPort(buf[:n], *c)
				}
				continue
			}
			if _, gone := p.former.Load(from); gone {
				continue
			}
			p.client.Store(&from)
			pc.WriteToUDPAddrPort(buf[:n], *p.target.Load())
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return p
}

func (p *udpProxy) addr() netip.AddrPort { return netip.MustParseAddrPort(p.pc.LocalAddr().String()) }

func (p *udpProxy) switchTo(target netip.AddrPort) {
	p.former.Store(*p.target.Load(), true)
	p.former.Delete(target)
	p.target.Store(&target)
}

// handClock is a clock the test moves by hand (Config.Clock). Each NewTimer is announced on timers
// and fires when the test fires it; a ticker ticks when the test calls tick. Now and Since are the
// wall clock's. It serves one keep-alive loop.
type handClock struct {
	clock.RealClock
	timers chan *handTimer
	ticks  chan time.Time
	ready  chan struct{} // a token each time the keep-alive loop waits for its next tick
}

func newHandClock() *handClock {
	return &handClock{timers: make(chan *handTimer, 64), ticks: make(chan time.Time), ready: make(chan struct{}, 1)}
}

func (k *handClock) NewTimer(d time.Duration) clock.Timer {
	tm := &handTimer{d: d, c: make(chan time.Time, 1)}
	k.timers <- tm
	return tm
}

func (k *handClock) NewTicker(time.Duration) clock.Ticker { return handTicker{k} }

// tick waits until the keep-alive loop waits for its next tick, having done all the last one
// asked, then runs before (when set) and hands the loop the tick.
func (k *handClock) tick(t *testing.T, before func()) {
	t.Helper()
	select {
	case <-k.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("no keep-alive loop waits for a tick")
	}
	if before != nil {
		before()
	}
	k.ticks <- time.Now()
}

// timer is the next timer the code under test asked for.
func (k *handClock) timer(t *testing.T) *handTimer {
	t.Helper()
	select {
	case tm := <-k.timers:
		return tm
	case <-time.After(15 * time.Second):
		t.Fatal("no timer asked for")
		return nil
	}
}

type handTimer struct {
	d time.Duration // what the code asked to wait
	c chan time.Time
}

func (h *handTimer) C() <-chan time.Time      { return h.c }
func (h *handTimer) Stop() bool               { return true }
func (h *handTimer) Reset(time.Duration) bool { return true }
func (h *handTimer) fire()                    { h.c <- time.Now() }

type handTicker struct{ k *handClock }

// C is read each time the loop waits for a tick: it leaves the token that says so.
func (h handTicker) C() <-chan time.Time {
	select {
	case h.k.ready <- struct{}{}:
	default:
	}
	return h.k.ticks
}
func (handTicker) Stop() {}
