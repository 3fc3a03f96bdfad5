package vpnhub

import (
	"context"
	"encoding/binary"
	"net/netip"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"code.foss.global/serve.zone/relay/contracts"
)

// fakeClock is a Clock that moves only when told. Due timers fire inside Advance, in order.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	f       func()
	stopped bool
}

func newFakeClock(ms int64) *fakeClock { return &fakeClock{now: time.UnixMilli(ms)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// Advance moves the clock and runs every timer that fell due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due, rest []*fakeTimer
	for _, t := range c.timers {
		switch {
		case t.stopped:
		case !t.at.After(c.now):
			t.stopped = true
			due = append(due, t)
		default:
			rest = append(rest, t)
		}
	}
	c.timers = rest
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
	for _, t := range due {
		t.f()
	}
}

// ipv4Packet builds an IPv4/UDP packet from src to dst carrying payload, checksums included.
func ipv4Packet(src, dst netip.Addr, payload []byte) []byte {
	p := make([]byte, 28+len(payload))
	p[0], p[8], p[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	s, d := src.As4(), dst.As4()
	copy(p[12:16], s[:])
	copy(p[16:20], d[:])
	binary.BigEndian.PutUint16(p[10:], checksum(p[:20]))
	binary.BigEndian.PutUint16(p[20:], 4000)
	binary.BigEndian.PutUint16(p[22:], 5000)
	binary.BigEndian.PutUint16(p[24:], uint16(8+len(payload)))
	copy(p[28:], payload)
	return p
}

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// testHub is a hub on loopback with a fake clock, served until the test ends.
type testHub struct {
	*Hub
	clock *fakeClock
	key   StaticKey
	stop  func() // stops the hub and waits for Run; idempotent, also run at cleanup
}

const testAuthority = "authority-1"

func startHub(t *testing.T, mod func(*Config)) *testHub {
	t.Helper()
	clock := newFakeClock(testNow)
	cfg := Config{Listen: "127.0.0.1:0", Key: testKey(t, 1), Clock: clock, Logger: testLogger(t), IdleTimeout: 10 * time.Second,
		HandshakeBurst: 1000} // the fake clock stands still: the limiter would never refill
	if mod != nil {
		mod(&cfg)
	}
	h, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("hub Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &testHub{Hub: h, clock: clock, key: cfg.Key, stop: stop}
}

func (th *testHub) push(t *testing.T, generation int64, members ...contracts.VPNMember) int64 {
	t.Helper()
	body := contracts.EncodeVPNMembershipPush(contracts.VPNMembership{
		AuthorityID: testAuthority, ControlPrefix: netip.MustParsePrefix("10.64.0.0/24"), Generation: generation, Members: members,
	})
	ans, err := th.PushMembership(body)
	if err != nil {
		t.Fatal(err)
	}
	g, ok := contracts.ReadVPNMembershipApplied(ans)
	if !ok {
		t.Fatalf("answer %s", ans)
	}
	return g
}

func (th *testHub) addr() netip.AddrPort {
	return netip.MustParseAddrPort(th.tr.Conn.LocalAddr().String())
}

// dial joins as node with key, to the hub under authority.
func (th *testHub) dial(t *testing.T, key StaticKey, node, authority string) (*Conn, error) {
	t.Helper()
	cl, err := NewClient(ClientConfig{Hub: th.addr(), HubKey: th.key.Public, AuthorityID: authority, NodeID: node, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return cl.Dial(ctx)
}

func (th *testHub) mustDial(t *testing.T, key StaticKey, node string) *Conn {
	t.Helper()
	c, err := th.dial(t, key, node, testAuthority)
	if err != nil {
		t.Fatalf("dial %s: %v", node, err)
	}
	return c
}

func (th *testHub) drops(r dropReason) float64 { return testutil.ToFloat64(th.m.dropBy[r]) }

func (th *testHub) handshakes(outcome string) float64 {
	return testutil.ToFloat64(th.m.handshakes.WithLabelValues(outcome))
}

// eventually polls cond until it holds or 10 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
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

// waitClosed waits for c's session to end and returns why.
func waitClosed(t *testing.T, c *Conn) error {
	t.Helper()
	select {
	case <-c.Done():
		return c.Err()
	case <-time.After(10 * time.Second):
		t.Fatal("session still open")
		return nil
	}
}

// checkLeaks fails the test if goroutines it started outlive it. Call it first: cleanups run
// last-in first-out, so the check runs after every other cleanup stopped hubs and clients.
func checkLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// testLogger logs to the test's output when VPNHUB_TEST_LOG is set.
func testLogger(t *testing.T) zerolog.Logger {
	if os.Getenv("VPNHUB_TEST_LOG") == "" {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
}
