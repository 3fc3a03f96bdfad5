package ha

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flynn/noise"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"code.foss.global/serve.zone/relay/testenv/await"
)

// The replication channel over real TCP loopback and real Noise, without the election: the
// leader's and the standby's replication are built on ports that say who leads and where the
// leader is, as the Elector's do through the API. Time, where it is the subject (keepalive,
// silence, the acknowledgement bound), is a fake clock stepped by the test.

var testKey = func() []byte {
	k := make([]byte, 32)
	rand.Read(k)
	return k
}()

// waitFor is the tests' bound on an event another goroutine owns: generous, never the subject.
const waitFor = 20 * time.Second

// memPart is a replicated part: records in a map.
type memPart struct {
	mu       sync.Mutex
	records  map[string]string
	watchers map[int]func(string, []byte)
	next     int
	forgot   int
}

func newMemPart() *memPart {
	return &memPart{records: map[string]string{}, watchers: map[int]func(string, []byte){}}
}

func (p *memPart) Replicate(send func(string, []byte)) func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, v := range p.records {
		send(k, []byte(v))
	}
	id := p.next
	p.next++
	p.watchers[id] = send
	return func() { p.mu.Lock(); delete(p.watchers, id); p.mu.Unlock() }
}

func (p *memPart) set(k, v string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.records[k] = v
	for _, w := range p.watchers {
		w(k, []byte(v))
	}
}

func (p *memPart) Adopt(k string, v []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v == nil {
		delete(p.records, k)
	} else {
		p.records[k] = string(v)
	}
	return nil
}

func (p *memPart) ForgetCopy() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.records)
	p.forgot++
}

func (p *memPart) get(k string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.records[k]
}

// side is one relay's replication, running until the test ends.
type side struct {
	r   *replication
	reg *prometheus.Registry
}

type option func(*replicationConfig, *replicationPorts)

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func build(t testing.TB, cfg replicationConfig, p replicationPorts, opts ...option) *side {
	t.Helper()
	for _, o := range opts {
		o(&cfg, &p)
	}
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newReplication(cfg, p, zerolog.Nop(), m)
	if err != nil {
		t.Fatal(err)
	}
	return &side{r: r, reg: reg}
}

// startLeader runs the leader relay-a's side: it always leads, on ln (nil: a new listener).
func startLeader(t testing.TB, clk clock.WithTickerAndDelayedExecution, part *memPart, ln net.Listener, opts ...option) *side {
	t.Helper()
	if ln == nil {
		ln = listen(t)
	}
	s := build(t, replicationConfig{listener: ln, key: testKey, parts: []Part{{Prefix: "run/", Part: part, Runs: "run/"}},
		self: []string{"relay-a"}, pod: "relay-a", clock: clk},
		replicationPorts{leading: func() bool { return true }, holder: func() string { return "relay-a" }}, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.r.serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// startStandby runs standby pod's side, following the leader at addr.
func startStandby(t testing.TB, clk clock.WithTickerAndDelayedExecution, part *memPart, addr, pod string) *side {
	t.Helper()
	s := build(t, replicationConfig{key: testKey, parts: []Part{{Prefix: "run/", Part: part, Runs: "run/"}}, self: []string{pod}, pod: pod, clock: clk},
		replicationPorts{leading: func() bool { return false }, holder: func() string { return "relay-a" },
			address: func(context.Context, string) (string, error) { return addr, nil }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.r.follow(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

func (s *side) addr() string { return s.r.cfg.listener.Addr().String() }

func (s *side) standbys() int {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	return len(s.r.byPod)
}

func (s *side) feedOf(pod string) *feed {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	return s.r.byPod[pod]
}

func (s *side) counter(name, reason string) float64 {
	var c *prometheus.CounterVec
	switch name {
	case "refused":
		c = s.r.m.refused
	case "dropped":
		c = s.r.m.dropped
	case "unreplicated":
		c = s.r.m.unreplicated
	}
	return testutil.ToFloat64(c.WithLabelValues(reason))
}

// raw is a standby played by the test: the real handshake and frames, and whatever it says next.
type raw struct {
	t    *testing.T
	conn net.Conn
	ch   *channel
}

// dialRaw runs the handshake as a standby would; with pod set it then says { pod }.
func dialRaw(t *testing.T, addr, pod string) *raw {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(waitFor))
	ch, err := handshake(conn, testKey, true)
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	rw := &raw{t: t, conn: conn, ch: ch}
	if pod != "" {
		rw.send(helloFrame(pod))
	}
	return rw
}

func (rw *raw) send(frame []byte) {
	rw.t.Helper()
	if err := rw.ch.writeFrame(frame); err != nil {
		rw.t.Fatalf("send: %v", err)
	}
}

// next reads the leader's next frame; ok false once the leader has closed the channel.
func (rw *raw) next() (op byte, key string, ok bool) {
	rw.t.Helper()
	b, err := rw.ch.readFrame(maxFrame)
	if err != nil {
		return 0, "", false
	}
	op, key, _, err = readRecord(b)
	if err != nil {
		rw.t.Fatalf("the leader sent a frame that does not read: %v", err)
	}
	return op, key, true
}

// snapshot reads the leader's whole state up to its synced marker, and returns how many records
// that was, the marker included.
func (rw *raw) snapshot() uint64 {
	rw.t.Helper()
	for n := uint64(1); ; n++ {
		op, _, ok := rw.next()
		switch {
		case !ok:
			rw.t.Fatal("the leader closed the channel before its whole state")
		case op == opSynced:
			return n
		case op == opPing:
			n--
		}
	}
}

// closed waits until the leader closes the channel, reading and discarding what it still sends,
// and returns the frames it read.
func (rw *raw) closed() int {
	rw.t.Helper()
	n := 0
	for {
		if _, _, ok := rw.next(); !ok {
			return n
		}
		n++
	}
}

// recorder is a TCP forwarder between a standby and the leader that records what the standby
// sends: a wiretap on the cluster network.
type recorder struct {
	ln   net.Listener
	mu   sync.Mutex
	sent []byte // guarded by mu: every byte the standby sent
}

func startRecorder(t *testing.T, target string) *recorder {
	rec := &recorder{ln: listen(t)}
	t.Cleanup(func() { rec.ln.Close() })
	go func() {
		for {
			c, err := rec.ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go func() { io.Copy(c, up); c.Close() }()
			go func() {
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					rec.mu.Lock()
					rec.sent = append(rec.sent, buf[:n]...)
					rec.mu.Unlock()
					if _, werr := up.Write(buf[:n]); werr != nil || err != nil {
						up.Close()
						return
					}
				}
			}()
		}
	}()
	return rec
}

// opening is the standby's first two messages as recorded: its handshake message 1, and the
// transport message carrying its { pod }.
func (rec *recorder) opening(t *testing.T) []byte {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	b, end := rec.sent, 0
	for range 2 {
		if len(b) < end+2 {
			t.Fatal("the recording holds less than the standby's opening")
		}
		end += 2 + int(binary.BigEndian.Uint16(b[end:]))
	}
	return append([]byte(nil), b[:end]...)
}

// handshakeReply is the size of the leader's handshake message 2 on the wire: its length prefix,
// its ephemeral key, and the tag of an empty payload.
const handshakeReply = 2 + 32 + 16

// TestReplayedHandshakeBuysNothing: a standby's opening recorded off the wire — its handshake
// message 1 and its { pod } — and replayed 20 times gets a handshake reply each time and not one
// byte more, though the leader holds a run; no replay is counted as a standby.
func TestReplayedHandshakeBuysNothing(t *testing.T) {
	part := newMemPart()
	part.set("run/node-a", strings.Repeat("r", 1800)) // a held run
	leader := startLeader(t, nil, part, nil)
	rec := startRecorder(t, leader.addr())
	copyOf := newMemPart()
	standby := startStandby(t, nil, copyOf, rec.ln.Addr().String(), "relay-b")
	await.Until(t, "the standby's complete copy", waitFor, standby.r.complete)
	opening := rec.opening(t)

	for i := range 20 {
		conn, err := net.Dial("tcp", leader.addr())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(waitFor))
		if _, err := conn.Write(opening); err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(conn)
		conn.Close()
		if len(got) != handshakeReply {
			t.Fatalf("replay %d got %d bytes, want the %d of a handshake reply and nothing more", i, len(got), handshakeReply)
		}
	}
	if n := leader.standbys(); n != 1 {
		t.Fatalf("the leader counts %d standbys after 20 replays, want the real one", n)
	}
	if got := leader.counter("refused", "hello"); got != 20 {
		t.Fatalf("refused{hello} = %v, want 20", got)
	}
	if copyOf.get("run/node-a") == "" {
		t.Fatal("the real standby lost its copy")
	}
}

// TestChannelWithoutPodGetsNothing: after the handshake the leader sends nothing until the
// standby has said { pod } under it — not for a silent peer, not for any other first frame, and
// not for a hello naming the leader's own Pod, a name that is no Pod name, or a Pod the API does
// not find in the release.
func TestChannelWithoutPodGetsNothing(t *testing.T) {
	part := newMemPart()
	part.set("run/node-a", "held")
	notInRelease := errors.New("not of this release")
	leader := startLeader(t, nil, part, nil, func(_ *replicationConfig, p *replicationPorts) {
		p.checkPod = func(_ context.Context, pod string) error {
			if pod == "relay-x" {
				return notInRelease
			}
			return nil
		}
	})
	for _, c := range []struct {
		name   string
		first  []byte // nil: nothing (the leader's handshake deadline ends it)
		reason string
	}{
		{"silent", nil, "hello"},
		{"an acknowledgement first", ackFrame(0), "hello"},
		{"a hello with another member", []byte(`{"pod":"relay-b","role":"standby"}`), "hello"},
		{"the leader's own Pod", helloFrame("relay-a"), "pod"},
		{"not a Pod name", helloFrame("Relay_B"), "pod"},
		{"a Pod not of the release", helloFrame("relay-x"), "pod"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := leader.counter("refused", c.reason)
			rw := dialRaw(t, leader.addr(), "")
			if c.first != nil {
				rw.send(c.first)
			}
			if n := rw.closed(); n != 0 {
				t.Fatalf("the leader sent %d frames", n)
			}
			await.Until(t, "the refusal counted", waitFor, func() bool { return leader.counter("refused", c.reason) == before+1 })
		})
	}
	if n := leader.standbys(); n != 0 {
		t.Fatalf("%d standbys counted", n)
	}
}

// TestNinthChannelRefused: eight standbys are fed; a ninth connection is closed at accept,
// before a handshake reply.
func TestNinthChannelRefused(t *testing.T) {
	leader := startLeader(t, nil, newMemPart(), nil)
	for i := range maxChannels {
		rw := dialRaw(t, leader.addr(), fmt.Sprintf("relay-%d", i))
		rw.snapshot()
	}
	await.Until(t, "eight standbys fed", waitFor, func() bool { return leader.standbys() == maxChannels })
	conn, err := net.Dial("tcp", leader.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(waitFor))
	writeMessage(conn, messageOne(t))
	if got, _ := io.ReadAll(conn); len(got) != 0 {
		t.Fatalf("the ninth connection got %d bytes", len(got))
	}
	if got := leader.counter("refused", "limit"); got != 1 {
		t.Fatalf("refused{limit} = %v", got)
	}
	if n := leader.standbys(); n != maxChannels {
		t.Fatalf("%d standbys after the refusal", n)
	}
}

// TestUnauthenticatedConnectionsGiveWayToAStandby: connections that never say { pod } hold no
// slot against a standby: the oldest gives way.
func TestUnauthenticatedConnectionsGiveWayToAStandby(t *testing.T) {
	leader := startLeader(t, nil, newMemPart(), nil)
	for range maxChannels {
		dialRaw(t, leader.addr(), "") // handshakes, then nothing
	}
	rw := dialRaw(t, leader.addr(), "relay-b")
	rw.snapshot()
	await.Until(t, "the standby fed", waitFor, func() bool { return leader.standbys() == 1 })
}

// TestNewerChannelReplacesTheOlder: one channel per Pod; a second from the same Pod replaces the
// first.
func TestNewerChannelReplacesTheOlder(t *testing.T) {
	leader := startLeader(t, nil, newMemPart(), nil)
	first := dialRaw(t, leader.addr(), "relay-b")
	first.snapshot()
	second := dialRaw(t, leader.addr(), "relay-b")
	second.snapshot()
	first.closed()
	await.Until(t, "the older channel dropped as replaced", waitFor, func() bool { return leader.counter("dropped", "replaced") == 1 })
	if n := leader.standbys(); n != 1 {
		t.Fatalf("%d standbys for one Pod", n)
	}
	if leader.feedOf("relay-b") == nil {
		t.Fatal("the newer channel is not fed")
	}
}

// waitTicker waits until n tickers or timers wait on clk: the goroutines that own them have
// started.
func waitTicker(t *testing.T, clk *clocktesting.FakeClock, n int) {
	t.Helper()
	await.Until(t, fmt.Sprintf("%d waiters on the clock", n), waitFor, func() bool { return clk.Waiters() >= n })
}

// TestLeaderKeepsAliveAndDropsASilentStandby: the leader pings every 2 s; a standby that
// acknowledges keeps its channel; one silent for more than 10 s is dropped, after exactly the pings
// that fit in 10 s.
func TestLeaderKeepsAliveAndDropsASilentStandby(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	leader := startLeader(t, clk, newMemPart(), nil)
	rw := dialRaw(t, leader.addr(), "relay-b")
	n := rw.snapshot()
	waitTicker(t, clk, 1)
	f := leader.feedOf("relay-b")
	for i := range uint64(6) { // 12 s, acknowledging every ping
		clk.Step(keepalive)
		if op, _, ok := rw.next(); !ok || op != opPing {
			t.Fatalf("no ping after a keepalive period (op %d, open %v)", op, ok)
		}
		rw.send(ackFrame(n - 1 + i%2)) // acknowledgements need not advance to keep a channel
		await.Until(t, "the acknowledgement heard", waitFor, func() bool { return f.heard.Load() == clk.Now().UnixNano() })
	}
	// Silent from now on: a ping at 2, 4, 6, 8 and 10 s of silence, then the channel ends.
	pings := 0
	for ; pings <= int(silence/keepalive); pings++ {
		clk.Step(keepalive)
		op, _, ok := rw.next()
		if !ok {
			break
		}
		if op != opPing {
			t.Fatalf("op %d", op)
		}
	}
	if pings != int(silence/keepalive) {
		t.Fatalf("%d pings before the silent standby was dropped, want %d", pings, silence/keepalive)
	}
	await.Until(t, "dropped as silent", waitFor, func() bool { return leader.counter("dropped", "silent") == 1 && leader.standbys() == 0 })
}

// TestStandbyKeepsAliveAndDropsASilentLeader: the standby acknowledges every 2 s, and drops a
// leader it has heard nothing from for more than 10 s; its copy is no longer complete.
func TestStandbyKeepsAliveAndDropsASilentLeader(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	ln := listen(t)
	defer ln.Close()
	accepted := acceptOne(ln)
	standby := startStandby(t, clk, newMemPart(), ln.Addr().String(), "relay-b")
	ch := <-accepted
	defer ch.conn.Close()
	if b, err := ch.readFrame(maxPeerFrame); err != nil || string(b) != string(helloFrame("relay-b")) {
		t.Fatalf("the standby's first message: %q, %v", b, err)
	}
	ch.writeFrame(record{key: "run/node-a", value: []byte("x")}.frame())
	ch.writeFrame(record{synced: true}.frame())
	// The standby may acknowledge the record alone first, when its read buffer ran dry between
	// the two frames: its acknowledgement of the whole copy is the one that counts both.
	for {
		b, err := ch.readFrame(maxPeerFrame)
		if err != nil {
			t.Fatalf("the standby's acknowledgement of its copy: %v", err)
		}
		n, err := readAck(b)
		if err != nil || n > 2 {
			t.Fatalf("the standby's acknowledgement of its copy: %x, %v", b, err)
		}
		if n == 2 {
			break
		}
	}
	if !standby.r.complete() {
		t.Fatal("the copy is not complete")
	}
	waitTicker(t, clk, 1)
	acks := 0
	for ; acks <= int(silence/keepalive); acks++ {
		clk.Step(keepalive)
		b, err := ch.readFrame(maxPeerFrame)
		if err != nil {
			break
		}
		if n, err := readAck(b); err != nil || n != 2 {
			t.Fatalf("keepalive %x", b)
		}
	}
	if acks != int(silence/keepalive) {
		t.Fatalf("%d keepalives before the standby dropped the silent leader, want %d", acks, silence/keepalive)
	}
	if standby.r.complete() {
		t.Fatal("a copy from a silent leader still reads complete")
	}
}

// TestStandbyIsReadyOnlyWithACompleteCopy: a standby's readiness (its /readyz, through the
// Elector's Ready) waits for the whole of the leader's state: records arriving are not enough,
// the leader's word that the copy is complete is.
func TestStandbyIsReadyOnlyWithACompleteCopy(t *testing.T) {
	ln := listen(t)
	defer ln.Close()
	accepted := acceptOne(ln)
	copyOf := newMemPart()
	standby := startStandby(t, nil, copyOf, ln.Addr().String(), "relay-b")
	if standby.r.copyReady() == nil {
		t.Fatal("ready before it connected to the leader")
	}
	ch := <-accepted
	defer ch.conn.Close()
	if b, err := ch.readFrame(maxPeerFrame); err != nil || string(b) != string(helloFrame("relay-b")) {
		t.Fatalf("the standby's first message: %q, %v", b, err)
	}
	ch.writeFrame(record{key: "run/node-a", value: []byte("x")}.frame())
	ch.writeFrame(record{key: "run/node-b", value: []byte("y")}.frame())
	await.Until(t, "both records in the copy", waitFor, func() bool { return copyOf.get("run/node-b") == "y" })
	if err := standby.r.copyReady(); err == nil {
		t.Fatal("ready with two records and no word that the copy is complete")
	} else if !strings.Contains(err.Error(), "not complete") {
		t.Fatalf("not ready for %q, want the copy named", err)
	}
	ch.writeFrame(record{synced: true}.frame())
	await.Until(t, "ready once the leader said the copy is whole", waitFor, func() bool { return standby.r.copyReady() == nil })
}

// acceptOne plays a leader's side of one replication channel: it accepts a standby's dial on ln
// and completes the handshake, and sends the channel.
func acceptOne(ln net.Listener) <-chan *channel {
	accepted := make(chan *channel, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		ch, err := handshake(conn, testKey, false)
		if err != nil {
			conn.Close()
			return
		}
		accepted <- ch
	}()
	return accepted
}

// flakyListener fails its first Accept.
type flakyListener struct {
	net.Listener
	once sync.Once
}

func (l *flakyListener) Accept() (net.Conn, error) {
	var fail bool
	l.once.Do(func() { fail = true })
	if fail {
		return nil, errors.New("accept4: too many open files")
	}
	return l.Listener.Accept()
}

// TestAcceptErrorDoesNotEndTheListener: a failed Accept is counted and retried; the standby that
// dials next is fed.
func TestAcceptErrorDoesNotEndTheListener(t *testing.T) {
	part := newMemPart()
	part.set("run/node-a", "held")
	leader := startLeader(t, nil, part, &flakyListener{Listener: listen(t)})
	copyOf := newMemPart()
	standby := startStandby(t, nil, copyOf, leader.addr(), "relay-b")
	await.Until(t, "the standby's complete copy", waitFor, standby.r.complete)
	if copyOf.get("run/node-a") != "held" {
		t.Fatal("the copy lacks the leader's run")
	}
	if got := testutil.ToFloat64(leader.r.m.acceptErrors); got != 1 {
		t.Fatalf("accept errors %v", got)
	}
}

// TestWriteDeadline: a standby that stops reading ends its channel once a write has waited the
// write timeout; its queue is given back.
func TestWriteDeadline(t *testing.T) {
	part := newMemPart()
	for i := range 64 {
		part.set(fmt.Sprintf("run/node-%02d", i), strings.Repeat("r", 256<<10)) // 16 MiB: past any socket buffer
	}
	leader := startLeader(t, nil, part, nil, func(c *replicationConfig, _ *replicationPorts) { c.writeTimeout = 200 * time.Millisecond })
	rw := dialRaw(t, leader.addr(), "relay-b")
	_ = rw // it reads nothing
	await.Until(t, "the stalled standby dropped", waitFor, func() bool { return leader.counter("dropped", "write-stalled") == 1 })
	if n := leader.standbys(); n != 0 {
		t.Fatalf("%d standbys", n)
	}
}

// TestSyncWaitsForTheStandbysAcknowledgement: Sync answers once every standby with a complete copy
// has acknowledged what was sent before it; at once, unreplicated, with none; and, once the bound
// passes, unreplicated, with the standby that missed it closed.
func TestSyncWaitsForTheStandbysAcknowledgement(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	part := newMemPart()
	leader := startLeader(t, clk, part, nil)
	answered := make(chan bool, 1)
	done := func(ok bool) { answered <- ok }

	leader.r.sync(done)
	if ok := <-answered; ok || leader.counter("unreplicated", unreplicatedNoStandby) != 1 {
		t.Fatalf("with no standby: replicated %v, counted %v", ok, leader.counter("unreplicated", unreplicatedNoStandby))
	}

	rw := dialRaw(t, leader.addr(), "relay-b")
	n := rw.snapshot()
	rw.send(ackFrame(n))
	await.Until(t, "the standby's copy complete", waitFor, func() bool { f := leader.feedOf("relay-b"); return f != nil && f.isReady() })
	part.set("run/node-a", "held")
	leader.r.sync(done)
	if op, key, _ := rw.next(); op != opSet || key != "run/node-a" {
		t.Fatalf("the standby got op %d %q", op, key)
	}
	select {
	case ok := <-answered:
		t.Fatalf("answered (%v) before the standby acknowledged", ok)
	default:
	}
	rw.send(ackFrame(n + 1))
	if ok := <-answered; !ok {
		t.Fatal("an acknowledged change reads unreplicated")
	}

	// The standby stops acknowledging: past the bound it is closed, and the hold answered.
	part.set("run/node-b", "held")
	waitTicker(t, clk, 1) // the feed's keepalive ticker
	leader.r.sync(done)
	waitTicker(t, clk, 2) // and the bound
	clk.Step(DefaultAckTimeout)
	if ok := <-answered; ok {
		t.Fatal("a change the standby never acknowledged reads replicated")
	}
	rw.closed()
	await.Until(t, "the standby dropped for the missed acknowledgement", waitFor, func() bool {
		return leader.counter("dropped", "ack-missed") == 1 && leader.standbys() == 0
	})
	if got := leader.counter("unreplicated", unreplicatedAckMissed); got != 1 {
		t.Fatalf("unreplicated{ack-missed} = %v", got)
	}
	st := leader.r.status()
	if st.LastUnreplicated == nil || st.LastUnreplicated.Reason != unreplicatedAckMissed || st.LastDropped == nil || st.LastDropped.Reason != "ack-missed" {
		t.Fatalf("status: %+v", st)
	}
}

// TestStandbyCopyIsTheLeadersState: a standby's copy is the leader's state and nothing else: what
// the relay held before it copied this leader (its own term's records) is forgotten first.
func TestStandbyCopyIsTheLeadersState(t *testing.T) {
	part := newMemPart()
	part.set("run/node-a", "a")
	leader := startLeader(t, nil, part, nil)
	copyOf := newMemPart()
	copyOf.Adopt("run/stale", []byte("from this relay's own term"))
	standby := startStandby(t, nil, copyOf, leader.addr(), "relay-b")
	await.Until(t, "the copy", waitFor, func() bool { return standby.r.complete() && copyOf.get("run/node-a") == "a" })
	if copyOf.get("run/stale") != "" {
		t.Fatal("a record the leader never had survived the copy")
	}
	if st := standby.r.status(); st.Runs != 1 || st.Connected != 1 || !st.Complete {
		t.Fatalf("status %+v", st)
	}
}

// messageOne is a standby's handshake message 1, made afresh.
func messageOne(t *testing.T) []byte {
	t.Helper()
	hs, err := noise.NewHandshakeState(noise.Config{CipherSuite: suite, Pattern: noise.HandshakeNN, Initiator: true,
		Prologue: []byte(prologue), PresharedKey: testKey, PresharedKeyPlacement: 0})
	if err != nil {
		t.Fatal(err)
	}
	msg, _, _, err := hs.WriteMessage(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}
