package vpnhub

import (
	"context"
	"errors"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/quic-go/quic-go"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub/client"
	"code.foss.global/serve.zone/relay/vpnhub/internal/wire"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
	"code.foss.global/serve.zone/relay/vpnhub/vpntest"
)

// Short names for the shared test fixtures (internal/vpntest).
var (
	testKey    = vpntest.Key
	testMember = vpntest.Member
	ipv4Packet = vpntest.IPv4Packet
	eventually = vpntest.Eventually
	checkLeaks = vpntest.CheckLeaks
	testLogger = vpntest.Logger
	addrA      = vpntest.A
	addrB      = vpntest.B
	testPrefix = vpntest.ControlPrefix
)

const (
	testAuthority = vpntest.Authority
	testNow       = vpntest.Now
)

func testView(members ...contracts.VPNMember) *membershipView {
	return newMembershipView(contracts.VPNMembership{AuthorityID: testAuthority, ControlPrefix: testPrefix, Generation: 3, Members: members})
}

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

// testHub is a hub on loopback with a fake clock, served until the test ends.
type testHub struct {
	*Hub
	clock *fakeClock
	key   vpnkey.Pair
	stop  func() // stops the hub and waits for Run; idempotent, also run at cleanup
}

func startHub(t *testing.T, mod func(*Config, *Options)) *testHub {
	t.Helper()
	clock := newFakeClock(testNow)
	cfg := Config{Listen: "127.0.0.1:0", Key: testKey(t, 1), IdleTimeout: 10 * time.Second,
		HandshakeBurst: 1000} // the fake clock stands still: the limiter would never refill
	opts := Options{Logger: testLogger(t), Clock: clock}
	if mod != nil {
		mod(&cfg, &opts)
	}
	h, err := Listen(cfg, opts)
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
	ans, err := th.PushMembership(vpntest.Membership(generation, members...))
	if err != nil {
		t.Fatal(err)
	}
	g, ok := contracts.ReadVPNMembershipApplied(ans)
	if !ok {
		t.Fatalf("answer %s", ans)
	}
	return g
}

// dial joins as node with key, to the hub under authority, with the Go client.
func (th *testHub) dial(t *testing.T, key vpnkey.Pair, node, authority string) (*client.Conn, error) {
	t.Helper()
	cl, err := client.New(client.Config{Hub: th.Addr(), HubKey: th.key.Public, AuthorityID: authority, NodeID: node, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return cl.Dial(ctx)
}

// mustDial joins and waits until the hub has heard the client's first keep-alive, so that
// advancing the fake clock past the silence timeout does not close the session.
func (th *testHub) mustDial(t *testing.T, key vpnkey.Pair, node string) *client.Conn {
	t.Helper()
	c, err := th.dial(t, key, node, testAuthority)
	if err != nil {
		t.Fatalf("dial %s: %v", node, err)
	}
	eventually(t, node+"'s first keep-alive", func() bool { return th.live(key) })
	return c
}

// live reports whether key's current session has authenticated a datagram.
func (th *testHub) live(key vpnkey.Pair) bool {
	th.mu.Lock()
	defer th.mu.Unlock()
	s := th.sessions[key.Public]
	return s != nil && s.live.Load()
}

func (th *testHub) drops(r dropReason) float64 { return testutil.ToFloat64(th.m.dropBy[r]) }

func (th *testHub) handshakes(outcome string) float64 {
	return testutil.ToFloat64(th.m.handshakes.WithLabelValues(outcome))
}

func (th *testHub) closes(reason string) float64 {
	return testutil.ToFloat64(th.m.closes.WithLabelValues(reason))
}

// rawMember is a member written here from internal/wire instead of the Go client: it sends the
// message 1 it is told to, keeps its keys in reach, sends no keep-alive and answers nothing, so
// tests can replay, forge and stay silent.
type rawMember struct {
	qc     *quic.Conn
	stream *quic.Stream
	seal   *wire.Sealer
	open   *wire.Opener
	mtu    int
}

// message1 is a message 1 and the initiator that wrote it (nil for a replayer, who has only the
// bytes).
type message1 struct {
	ini   *wire.Initiator
	bytes []byte
}

// dialRaw opens a QUIC connection to the hub and sends m as message 1. It returns the connection
// with message 2 read, or the refusal the hub closed it with.
func (th *testHub) dialRaw(t *testing.T, m message1) (*rawMember, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: udp}
	t.Cleanup(func() { tr.Close(); udp.Close() })
	qc, err := tr.Dial(ctx, net.UDPAddrFromAddrPort(th.Addr()), wire.ClientTLSConfig(), &quic.Config{EnableDatagrams: true})
	if err != nil {
		t.Fatal(err)
	}
	st, err := qc.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := wire.WriteFrame(st, m.bytes); err != nil {
		t.Fatal(err)
	}
	st.SetDeadline(time.Now().Add(5 * time.Second))
	msg2, err := wire.ReadFrame(st, wire.MaxHandshakeMessage)
	if err != nil {
		<-qc.Context().Done()
		return nil, wire.FromCloseError(context.Cause(qc.Context()))
	}
	st.SetDeadline(time.Time{})
	if m.ini == nil {
		return nil, errors.New("the hub accepted a message 1 replayed without its initiator")
	}
	w, keys, err := m.ini.Finish(msg2)
	if err != nil {
		t.Fatal(err)
	}
	return &rawMember{qc: qc, stream: st, seal: wire.NewSealer(keys.Send, w.MTU), open: wire.NewOpener(keys.Recv), mtu: w.MTU}, nil
}

// hello writes a message 1 for node with key at timestamp (Unix µs).
func (th *testHub) hello(t *testing.T, key vpnkey.Pair, node string, timestamp int64) message1 {
	t.Helper()
	ini, msg1, err := wire.StartHandshake(&key, th.key.Public, testAuthority, contracts.VPNHello{NodeID: node, Timestamp: timestamp}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return message1{ini, msg1}
}

// send seals p and sends it; the returned datagram can be sent again with sendRaw.
func (m *rawMember) send(t *testing.T, p []byte) []byte {
	t.Helper()
	d, _ := m.seal.Seal(p)
	d = append([]byte(nil), d...)
	m.sendRaw(t, d)
	return d
}

func (m *rawMember) sendRaw(t *testing.T, d []byte) {
	t.Helper()
	if err := m.qc.SendDatagram(d); err != nil {
		t.Fatal(err)
	}
}

// ended waits for the member's connection to end and returns the refusal it ended with.
func (m *rawMember) ended(t *testing.T) error {
	t.Helper()
	select {
	case <-m.qc.Context().Done():
		return wire.FromCloseError(context.Cause(m.qc.Context()))
	case <-time.After(10 * time.Second):
		t.Fatal("session still open")
		return nil
	}
}

// receiveWithin returns the next packet c receives within d, or nil.
func receiveWithin(c *client.Conn, d time.Duration) []byte {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	p, err := c.ReceivePacket(ctx)
	if err != nil {
		return nil
	}
	return p
}

// waitClosed waits for c's session to end and returns why.
func waitClosed(t *testing.T, c *client.Conn) error {
	t.Helper()
	select {
	case <-c.Done():
		return c.Err()
	case <-time.After(10 * time.Second):
		t.Fatal("session still open")
		return nil
	}
}

// pop returns the oldest packet, or nil when the queue is empty.
func (q *packetQueue) pop() []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		return nil
	}
	p := q.ring[q.head]
	q.ring[q.head] = nil
	q.head = (q.head + 1) % len(q.ring)
	q.n--
	return p
}
