package typedsocket

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"
	"golang.org/x/sync/errgroup"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/memnet"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serveConns accepts WebSocket upgrades as server Conns with opts, hands each to accepted and
// runs it until it ends.
func serveConns(opts Options, accepted chan<- *Conn) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c := New(ws, opts)
		accepted <- c
		c.Run(context.Background())
	})
}

// rawClient serves a Conn with opts and dials it with a bare WebSocket, which writes and reads
// frames as the test spells them; ctx bounds the test (30 s), and all ends with it.
func rawClient(t *testing.T, opts Options) (ctx context.Context, srv *Conn, ws *websocket.Conn) {
	t.Helper()
	accepted := make(chan *Conn, 1)
	hs := httptest.NewServer(serveConns(opts, accepted))
	t.Cleanup(hs.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(hs.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	return ctx, <-accepted, ws
}

// pair connects a server Conn and a client Conn over a real loopback WebSocket.
func pair(t *testing.T, srvOpts, cliOpts Options) (srv, cli *Conn) {
	t.Helper()
	accepted := make(chan *Conn, 1)
	hs := httptest.NewServer(serveConns(srvOpts, accepted))
	ws, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(hs.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cli = New(ws, cliOpts)
	go cli.Run(context.Background())
	srv = <-accepted
	t.Cleanup(func() {
		cli.CloseNow()
		srv.CloseNow()
		<-cli.Done()
		<-srv.Done()
		hs.Close()
	})
	return srv, cli
}

// pipeServer connects a server Conn to a client WebSocket over an in-memory pipe, for a test in a
// synctest bubble: nothing reads the client's socket until the caller does. Both end with the test.
func pipeServer(t *testing.T, srvOpts Options) (*Conn, *websocket.Conn) {
	t.Helper()
	client, server := memnet.Pipe()
	accepted := make(chan *Conn, 1)
	hs := &http.Server{Handler: serveConns(srvOpts, accepted)}
	served := make(chan struct{})
	go func() { hs.Serve(memnet.Once(server)); close(served) }()
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return client, nil }}
	ws, _, err := websocket.Dial(context.Background(), "ws://pipe/", &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	srv := <-accepted
	t.Cleanup(func() {
		ws.CloseNow()
		srv.CloseNow()
		<-srv.Done()
		hs.Close()
		<-served
		tr.CloseIdleConnections()
	})
	return srv, ws
}

// pipePair is pair over an in-memory pipe, for a test in a synctest bubble.
func pipePair(t *testing.T, srvOpts, cliOpts Options) (srv, cli *Conn) {
	t.Helper()
	srv, ws := pipeServer(t, srvOpts)
	cli = New(ws, cliOpts)
	go cli.Run(context.Background())
	t.Cleanup(func() { cli.CloseNow(); <-cli.Done() })
	return srv, cli
}

// echo answers each request with its own body, from another goroutine.
func echo() HandlerFunc {
	return func(_ *Conn, r *Request) { go r.Respond(r.Body) }
}

// reversing answers each request with its own body, holding requests until batch of them have
// arrived and then answering those last first, so that answers leave in a different order than
// requests arrived, every time. The caller sends a multiple of batch requests.
func reversing(batch int) HandlerFunc {
	var mu sync.Mutex
	var held []*Request
	return func(_ *Conn, r *Request) {
		mu.Lock()
		held = append(held, r)
		var full []*Request
		if len(held) == batch {
			full, held = held, nil
		}
		mu.Unlock()
		if full != nil {
			go func() {
				for _, r := range slices.Backward(full) {
					r.Respond(r.Body)
				}
			}()
		}
	}
}

func TestThousandConcurrentCallsBothWays(t *testing.T) {
	// Room for every call at once: the test is about correlation, not back-pressure. Each side
	// answers its 1000 requests fifty at a time, last first.
	srv, cli := pair(t, Options{Handler: reversing(50), MaxQueue: 2000}, Options{Handler: reversing(50), MaxQueue: 2000})
	var g errgroup.Group
	for i := range 1000 {
		for _, c := range []*Conn{srv, cli} {
			g.Go(func() error {
				body := fmt.Sprintf(`{"i":%d,"big":12345678901234567890}`, i)
				got, err := c.Call(context.Background(), "echo", json.RawMessage(body))
				if err != nil {
					return err
				}
				if string(got) != body {
					return fmt.Errorf("call %d answered with %s", i, got)
				}
				return nil
			})
		}
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// TestForwardIsByteIdentical chains two connections through a forwarder that only rewrites
// correlation ids, as the relay does, and checks both bodies arrive byte for byte.
func TestForwardIsByteIdentical(t *testing.T) {
	const body = `{"n":12345678901234567890,"s":"<&>\u2028","raw":"` + "<&>\u2028" + `","f":1.50,"e":1E+2,"nested":{"z":1,"a":[true,null]}}`
	const answer = `{"ok":12345678901234567890,"s":"\u003c\u2029"}`
	var seen atomic.Value
	back, farEnd := pair(t, Options{}, Options{Handler: HandlerFunc(func(_ *Conn, r *Request) {
		seen.Store(string(r.Body))
		r.Respond(json.RawMessage(answer))
	})})
	forward := HandlerFunc(func(_ *Conn, r *Request) {
		if _, err := back.CallAsync(r.Method, r.Body, r.Answer); err != nil {
			r.Fail(err)
		}
	})
	_, near := pair(t, Options{Handler: forward}, Options{})
	got, err := near.Call(context.Background(), "reportRuntimeAssignmentObservation", json.RawMessage(body))
	if err != nil {
		t.Fatal(err)
	}
	if seen.Load() != body {
		t.Fatalf("forwarded request changed:\n got %s\nwant %s", seen.Load(), body)
	}
	if string(got) != answer {
		t.Fatalf("forwarded answer changed:\n got %s\nwant %s", got, answer)
	}
	_ = farEnd
}

func TestRemoteErrorTravelsUntouched(t *testing.T) {
	data := `{"code":"relay-node-foreign","n":12345678901234567890}`
	_, cli := pair(t, Options{Handler: HandlerFunc(func(_ *Conn, r *Request) {
		r.Fail(&Error{Text: "relay-node-foreign: node-x", Data: json.RawMessage(data)})
	})}, Options{})
	_, err := cli.Call(context.Background(), "registerClusterRelay", json.RawMessage(`{}`))
	var e *Error
	if !errors.As(err, &e) || e.Text != "relay-node-foreign: node-x" || string(e.Data) != data {
		t.Fatalf("err = %#v", err)
	}
	if !errors.Is(err, contracts.RelayNodeForeign) {
		t.Fatal("errors.Is does not read the refusal name")
	}
}

// A connection without a handler refuses every request by name. (Which methods a connection serves
// is the relay's dispatch table, relay/dispatch.go.)
func TestUnknownMethodIsRefusedByName(t *testing.T) {
	_, cli := pair(t, Options{}, Options{})
	_, err := cli.Call(context.Background(), "noSuchMethod", json.RawMessage(`{}`))
	var e *Error
	if !errors.Is(err, contracts.RelayMethodUnknown) || !errors.As(err, &e) || e.Text != "relay-method-unknown: noSuchMethod" {
		t.Fatalf("err = %v", err)
	}
}

func TestOversizedMessageClosesWith1009(t *testing.T) {
	srv, cli := pair(t, Options{ReadLimit: 1024, Handler: echo()}, Options{})
	if _, err := cli.Call(context.Background(), "small", json.RawMessage(`{"x":"`+strings.Repeat("a", 900)+`"}`)); err != nil {
		t.Fatalf("a message under the limit failed: %v", err)
	}
	_, err := cli.Call(context.Background(), "big", json.RawMessage(`{"x":"`+strings.Repeat("a", 2000)+`"}`))
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("oversized call: %v", err)
	}
	<-cli.Done()
	if got := websocket.CloseStatus(context.Cause(cli.Context())); got != websocket.StatusMessageTooBig {
		t.Fatalf("close status = %d (%v), want 1009", got, context.Cause(cli.Context()))
	}
	<-srv.Done()
}

func TestSetReadLimitRaisesTheLimit(t *testing.T) {
	srv, cli := pair(t, Options{ReadLimit: 1024, Handler: echo()}, Options{ReadLimit: 1 << 20})
	srv.SetReadLimit(1 << 20)
	if _, err := cli.Call(context.Background(), "big", json.RawMessage(`{"x":"`+strings.Repeat("a", 100_000)+`"}`)); err != nil {
		t.Fatalf("call after raising the limit: %v", err)
	}
}

func TestMalformedFrames(t *testing.T) {
	var served atomic.Int64
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		New(ws, Options{Handler: HandlerFunc(func(_ *Conn, r *Request) {
			served.Add(1)
			r.Respond(json.RawMessage(`{}`))
		})}).Run(context.Background())
	}))
	defer hs.Close()
	dial := func() *websocket.Conn {
		ws, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(hs.URL, "http"), nil)
		if err != nil {
			t.Fatal(err)
		}
		return ws
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// A request whose body is not an object is answered by name; the connection lives on.
	ws := dial()
	ws.Write(ctx, websocket.MessageText, []byte(`{"method":"m","request":[1],"correlation":{"id":"9","phase":"request"}}`))
	_, msg, err := ws.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	env, err := Decode(msg)
	if err != nil || env.ID != "9" || env.Error == nil || !strings.HasPrefix(env.Error.Text, "relay-request-invalid: ") {
		t.Fatalf("answer = %s (%v)", msg, err)
	}
	ws.Write(ctx, websocket.MessageText, []byte(`{"method":"m","request":{},"correlation":{"id":"10","phase":"request"}}`))
	if _, msg, err = ws.Read(ctx); err != nil || !strings.Contains(string(msg), `"id":"10"`) {
		t.Fatalf("connection did not survive an answerable malformed request: %s %v", msg, err)
	}
	ws.CloseNow()

	// Garbage that names no request closes that connection with 1008 and nothing else.
	bad := dial()
	bad.Write(ctx, websocket.MessageText, []byte("\x00garbage{"))
	_, _, err = bad.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("garbage: %v, want close 1008", err)
	}
	// A binary message is not an envelope.
	bin := dial()
	bin.Write(ctx, websocket.MessageBinary, []byte(`{}`))
	if _, _, err = bin.Read(ctx); websocket.CloseStatus(err) != websocket.StatusUnsupportedData {
		t.Fatalf("binary: %v, want close 1003", err)
	}
	// The server still serves a new connection.
	good := dial()
	defer good.CloseNow()
	c := New(good, Options{})
	go c.Run(ctx)
	if _, err := c.Call(ctx, "m", json.RawMessage(`{}`)); err != nil {
		t.Fatalf("server stopped serving after malformed frames: %v", err)
	}
	c.CloseNow()
	<-c.Done()
	if served.Load() != 2 {
		t.Fatalf("served %d requests, want 2", served.Load())
	}
}

func TestCallTimeoutAndClose(t *testing.T) {
	var held sync.Map
	srv, cli := pair(t, Options{Handler: HandlerFunc(func(_ *Conn, r *Request) { held.Store(r, true) })}, Options{CallTimeout: 50 * time.Millisecond})
	_, err := cli.Call(context.Background(), "slow", json.RawMessage(`{}`))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	done := make(chan error, 1)
	if _, err := cli.CallAsync("slow", json.RawMessage(`{}`), func(r Reply) { done <- r.Err }, Timeout(time.Hour)); err != nil {
		t.Fatal(err)
	}
	srv.CloseNow()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("pending call on close: %v, want ErrClosed", err)
	}
	<-cli.Done()
	if _, err := cli.CallAsync("after", json.RawMessage(`{}`), func(Reply) { t.Error("done called for a refused call") }); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after close: %v", err)
	}
}

// TestQueueFullRefusesInsteadOfBlocking: a peer that never reads fills its queue; the caller gets
// ErrQueueFull at once and is never blocked.
func TestQueueFullRefusesInsteadOfBlocking(t *testing.T) {
	stalled := make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		<-stalled // never reads
		ws.CloseNow()
	}))
	defer hs.Close()
	defer close(stalled)
	ws, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(hs.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := New(ws, Options{MaxQueue: 4, MaxQueueBytes: 1 << 20})
	go c.Run(context.Background())
	defer func() { c.CloseNow(); <-c.Done() }()
	big := json.RawMessage(`{"x":"` + strings.Repeat("a", 256<<10) + `"}`)
	for i := 0; ; i++ {
		if i > 10_000 {
			t.Fatal("the queue never filled")
		}
		start := time.Now()
		_, err := c.CallAsync("m", big, func(Reply) {}, Timeout(time.Hour))
		if d := time.Since(start); d > time.Second {
			t.Fatalf("CallAsync blocked for %s", d)
		}
		if errors.Is(err, ErrQueueFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := c.QueueLen(); n == 0 || n > 4 {
		t.Fatalf("queue length %d, want 1..4", n)
	}
}

// TestSilentPeerIsDropped: a peer that answers no ping is gone after the dead timeout.
func TestSilentPeerIsDropped(t *testing.T) {
	release := make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		<-release // no reader: pings are never answered
		ws.CloseNow()
	}))
	defer hs.Close()
	defer close(release)
	ws, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(hs.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := New(ws, Options{PingInterval: 20 * time.Millisecond, DeadTimeout: 150 * time.Millisecond})
	go c.Run(context.Background())
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a silent peer was never dropped")
	}
	if err := context.Cause(c.Context()); !strings.Contains(err.Error(), "peer silent") {
		t.Fatalf("cause = %v", err)
	}
}

// TestLivePeerSurvivesPings: a peer that answers pings is kept however quiet it is otherwise. In a
// synctest bubble the test lives through the time a silent peer with three times the live pair's
// dead timeout takes to be dropped: 25 ping intervals, past three of the pair's dead timeouts.
func TestLivePeerSurvivesPings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		opts := Options{PingInterval: 20 * time.Millisecond, DeadTimeout: 150 * time.Millisecond, Handler: echo()}
		_, cli := pipePair(t, opts, opts)
		silent, _ := pipeServer(t, Options{PingInterval: 20 * time.Millisecond, DeadTimeout: 490 * time.Millisecond}) // its peer reads nothing
		start := time.Now()
		<-silent.Done()
		if lived := time.Since(start); lived < 500*time.Millisecond || lived > 520*time.Millisecond {
			t.Fatalf("the silent peer was dropped after %s, want the first ping interval past its dead timeout", lived)
		}
		if err := context.Cause(silent.Context()); !strings.Contains(err.Error(), "peer silent") {
			t.Fatalf("the silent peer's cause = %v", err)
		}
		if _, err := cli.Call(context.Background(), "m", json.RawMessage(`{}`)); err != nil {
			t.Fatalf("a quiet but live peer was dropped: %v", err)
		}
	})
}

func TestInflightLimit(t *testing.T) {
	var held []*Request
	var mu sync.Mutex
	_, cli := pair(t, Options{MaxInflight: 2, Handler: HandlerFunc(func(_ *Conn, r *Request) {
		mu.Lock()
		held = append(held, r)
		mu.Unlock()
	})}, Options{})
	results := make(chan error, 3)
	for i := range 3 {
		cli.CallAsync("m"+strconv.Itoa(i), json.RawMessage(`{}`), func(r Reply) { results <- r.Err }, Timeout(time.Hour))
	}
	if err := <-results; !errors.Is(err, contracts.RelayNodeBusy) {
		t.Fatalf("third request: %v, want relay-node-busy", err)
	}
	mu.Lock()
	for _, r := range held {
		r.Respond(json.RawMessage(`{}`))
		r.Respond(json.RawMessage(`{"twice":true}`)) // a second answer is ignored
	}
	mu.Unlock()
	for range 2 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
}

// TestInflightCountsEveryRequest: a request answered from the read loop — a
// malformed one that names its id, a stream frame refused — counts as in flight like any other,
// so the count never goes below zero and the inflight bound holds for it too.
func TestInflightCountsEveryRequest(t *testing.T) {
	var srvp atomic.Pointer[Conn]
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c := New(ws, Options{MaxInflight: 4})
		srvp.Store(c)
		c.Run(context.Background())
	}))
	defer hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(hs.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	frames := []string{
		`{"method":"m","request":0,"correlation":{"id":"a","phase":"request"}}`,
		`{"method":"##VirtualStream##","request":{"streamId":"s"},"correlation":{"id":"b","phase":"request"}}`,
	}
	var srv *Conn
	for round := range 50 {
		for _, f := range frames {
			ws.Write(ctx, websocket.MessageText, []byte(f))
			if _, _, err := ws.Read(ctx); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			srv = srvp.Load()
			if n := srv.Inflight(); n < 0 {
				t.Fatalf("inflight is %d after %d rounds", n, round)
			}
		}
	}
	await.Until(t, "inflight 0 with every answer written", 2*time.Second, func() bool { return srv.Inflight() == 0 })
}

// TestStalledWriteEndsTheConnection: a peer that drains nothing is gone once one write has been
// blocked for the dead timeout, even when pings would not notice yet.
func TestStalledWriteEndsTheConnection(t *testing.T) {
	release := make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		<-release // never reads
		ws.CloseNow()
	}))
	defer hs.Close()
	defer close(release)
	ws, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(hs.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := New(ws, Options{PingInterval: time.Hour, DeadTimeout: 300 * time.Millisecond, MaxQueue: 1 << 20, MaxQueueBytes: 1 << 30})
	go c.Run(context.Background())
	big := json.RawMessage(`{"x":"` + strings.Repeat("a", 1<<20) + `"}`)
	for i := 0; i < 64; i++ {
		if _, err := c.CallAsync("m", big, func(Reply) {}, Timeout(time.Hour)); err != nil {
			break
		}
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a write blocked forever")
	}
	if cause := context.Cause(c.Context()); !strings.Contains(cause.Error(), "a write blocked") {
		t.Fatalf("cause = %v", cause)
	}
}

// TestPingFromASlowReaderDoesNotEndTheConnection: a peer that stops reading, and pings while our
// write to it has not moved for pongStall, keeps its connection: the WebSocket library would write
// the pong from the read loop, wait five seconds behind our blocked write and end the connection
// (the relay lost Cloudly that way in CI while Cloudly was slow to read). With Pongs the ping goes
// unanswered instead ("pong-skipped"), and everything sent arrives once the peer reads again. The
// peer pings once our write has stalled, whenever a busy machine gets there.
func TestPingFromASlowReaderDoesNotEndTheConnection(t *testing.T) {
	release := make(chan struct{})
	var got atomic.Int64
	peer := make(chan *websocket.Conn, 1)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		peer <- ws
		c := New(ws, Options{PingInterval: time.Hour, DeadTimeout: time.Hour, MaxInflight: 1 << 10,
			ReadLimit: 2 << 20, Handler: HandlerFunc(func(_ *Conn, r *Request) {
				if r.Method == "hold" {
					<-release // on the read loop: this peer reads nothing more until released
				}
				got.Add(1)
				r.Answer(Reply{Response: json.RawMessage(`{}`)})
			})})
		c.Run(context.Background())
	}))
	defer hs.Close()
	var once sync.Once
	defer once.Do(func() { close(release) })
	pongs := new(Pongs)
	ws, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(hs.URL, "http"), &websocket.DialOptions{OnPingReceived: pongs.OnPingReceived})
	if err != nil {
		t.Fatal(err)
	}
	skipped := make(chan struct{}, 1)
	c := New(ws, Options{Pongs: pongs, DeadTimeout: time.Hour, MaxQueue: 1 << 10, MaxQueueBytes: 1 << 30,
		Dropped: func(reason string) {
			if reason == "pong-skipped" {
				select {
				case skipped <- struct{}{}:
				default:
				}
			}
		}})
	go c.Run(context.Background())
	defer c.CloseNow()
	srv := <-peer

	answers := make(chan error, 25)
	if _, err := c.CallAsync("hold", json.RawMessage(`{}`), func(r Reply) { answers <- r.Err }, Timeout(time.Hour)); err != nil {
		t.Fatal(err)
	}
	big := json.RawMessage(`{"x":"` + strings.Repeat("a", 1<<20) + `"}`)
	for range 24 { // far more than the sockets' buffers hold: our write blocks
		if _, err := c.CallAsync("m", big, func(r Reply) { answers <- r.Err }, Timeout(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if !await.Within(time.Minute, func() bool { return c.Stalled(2 * pongStall) }) {
		t.Fatal("our write to a peer that reads nothing never stalled")
	}
	// The peer pings (its own read loop is held, so it never reads a pong: the ping waits on).
	pingCtx, stopPing := context.WithCancel(context.Background())
	defer stopPing()
	go srv.Ping(pingCtx)
	select {
	case <-skipped:
	case <-c.Context().Done():
		t.Fatalf("the connection ended while its peer was slow to read: %v", context.Cause(c.Context()))
	case <-time.After(time.Minute):
		t.Fatal("the peer's ping was never judged")
	}
	once.Do(func() { close(release) })
	for range 25 {
		if err := <-answers; err != nil {
			t.Fatalf("a call sent while the peer was slow to read: %v", err)
		}
	}
	if got.Load() != 25 {
		t.Fatalf("the peer served %d of 25 requests", got.Load())
	}
}

// TestPeerThatReadsNoAnswersIsBounded: answers count as in flight until written, so a peer that
// floods requests and never reads is first answered busy and then, once unwritten answers exceed
// the queue's byte bound, disconnected — never buffered without bound.
func TestPeerThatReadsNoAnswersIsBounded(t *testing.T) {
	accepted := make(chan *Conn, 1)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c := New(ws, Options{MaxInflight: 8, MaxQueueBytes: 256 << 10, Handler: echo()})
		accepted <- c
		c.Run(context.Background())
	}))
	defer hs.Close()
	ws, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(hs.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	srv := <-accepted
	big := `{"pad":"` + strings.Repeat("x", 16<<10) + `"}`
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; ; i++ {
		env := Envelope{Method: "m", ID: strconv.Itoa(i), Phase: PhaseRequest, Request: json.RawMessage(big)}
		if err := ws.Write(ctx, websocket.MessageText, env.Append(nil)); err != nil {
			break // the server closed us
		}
		if i > 100_000 {
			t.Fatal("the server kept accepting requests whose answers are never read")
		}
	}
	<-srv.Done()
	if n := srv.Inflight(); n > 8+(256<<10)/100 {
		t.Fatalf("inflight %d: unwritten answers beyond the byte bound", n)
	}
	if !strings.Contains(context.Cause(srv.Context()).Error(), "reads no answers") {
		t.Fatalf("cause = %v", context.Cause(srv.Context()))
	}
}

// TestCallCompletesExactlyOnceWhenClosing races calls against the connection closing: every call
// is completed exactly once, by done or by CallAsync's error, never both.
func TestCallCompletesExactlyOnceWhenClosing(t *testing.T) {
	for round := 0; round < 20; round++ {
		_, cli := pair(t, Options{Handler: HandlerFunc(func(*Conn, *Request) {})}, Options{MaxQueue: 1 << 20})
		var wg sync.WaitGroup
		var twice atomic.Int64
		for i := 0; i < 200; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var completions atomic.Int64
				complete := func() {
					if completions.Add(1) > 1 {
						twice.Add(1)
					}
				}
				if _, err := cli.CallAsync("m", json.RawMessage(`{}`), func(Reply) { complete() }, Timeout(time.Hour)); err != nil {
					complete()
				}
			}()
			if i == 100 {
				go cli.CloseNow()
			}
		}
		wg.Wait()
		<-cli.Done()
		if twice.Load() > 0 {
			t.Fatalf("round %d: %d calls completed twice", round, twice.Load())
		}
	}
}

// TestCloseWritesWhatIsQueuedFirst: Close waits for the send loop to write what is queued (it is
// woken by each write, not by a poll) before it closes; the peer has every frame.
func TestCloseWritesWhatIsQueuedFirst(t *testing.T) {
	const n = 500
	var got atomic.Int64
	srv, cli := pair(t, Options{MaxQueue: n}, Options{Handler: HandlerFunc(func(_ *Conn, r *Request) {
		got.Add(1)
		r.Respond(json.RawMessage(`{}`))
	})})
	body := json.RawMessage(`{"pad":"` + strings.Repeat("x", 4<<10) + `"}`)
	for range n {
		if _, err := srv.CallAsync("m", body, func(Reply) {}, Timeout(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Close(websocket.StatusNormalClosure, "done"); err != nil {
		t.Fatalf("Close: %v", err)
	}
	<-cli.Done()
	if g := got.Load(); g != n {
		t.Fatalf("the peer read %d of the %d requests queued before Close", g, n)
	}
}

// TestPendingCountsCallsUntilAnswered: Pending counts this side's calls from CallAsync until their
// answer is back.
func TestPendingCountsCallsUntilAnswered(t *testing.T) {
	_, cli := pair(t, Options{Handler: reversing(3)}, Options{})
	answered := make(chan error, 3)
	for i := range 3 {
		if _, err := cli.CallAsync("m"+strconv.Itoa(i), json.RawMessage(`{}`), func(r Reply) { answered <- r.Err }); err != nil {
			t.Fatal(err)
		}
		if i < 2 && cli.Pending() != i+1 {
			t.Fatalf("%d pending after %d calls the peer holds", cli.Pending(), i+1)
		}
	}
	for range 3 {
		if err := <-answered; err != nil {
			t.Fatal(err)
		}
	}
	if n := cli.Pending(); n != 0 {
		t.Fatalf("%d pending once every call was answered", n)
	}
}

// TestJudgeSeesEveryMessage: Judge is asked about every message, with the method of a well-formed
// request and "" for anything else (a frame that does not decode, an answer); a message it
// refuses ends the connection at once, neither served nor answered.
// A judge's close writes what is queued first, and an answer the send loop has taken from the
// queue but not yet written counts as queued: the close waits for it. (The send loop once said it
// was writing only from inside write; descheduled between taking and writing, on a starved
// machine, it let the close find nothing pending and lose the answer.)
func TestJudgeCloseWaitsForAnAnswerBeingWritten(t *testing.T) {
	taken, release := make(chan struct{}, 1), make(chan struct{})
	refused := make(chan struct{})
	opts := Options{
		Judge: func(method string) bool {
			if method == "refused" {
				close(refused)
				return false
			}
			return true
		},
		Handler: HandlerFunc(func(_ *Conn, r *Request) { r.Respond(json.RawMessage(`{}`)) }),
		afterTake: func() {
			select {
			case taken <- struct{}{}: // the first batch only: held until released
				<-release
			default:
			}
		},
	}
	ctx, srv, ws := rawClient(t, opts)
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"method":"a","correlation":{"id":"1","phase":"request"},"request":{}}`)); err != nil {
		t.Fatal(err)
	}
	<-taken // answer 1 has left the queue and is not written
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"method":"refused","correlation":{"id":"2","phase":"request"},"request":{}}`)); err != nil {
		t.Fatal(err)
	}
	<-refused
	// The read loop goes on to drain: it must wait for the write (and so ask to hear of it), not
	// close the connection.
	waiting := func() bool {
		srv.writtenMu.Lock()
		defer srv.writtenMu.Unlock()
		return srv.written != nil
	}
	for !waiting() {
		select {
		case <-srv.Context().Done():
			close(release)
			t.Fatalf("the judge's close did not wait for the answer being written: %v", context.Cause(srv.Context()))
		case <-time.After(time.Millisecond):
		}
	}
	close(release)
	if _, b, err := ws.Read(ctx); err != nil || !strings.Contains(string(b), `"id":"1"`) {
		t.Fatalf("read %q, %v; want the answer to request 1 before the close", b, err)
	}
	if _, b, err := ws.Read(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("after the refused message the connection stays open: read %q, %v", b, err)
	}
}

func TestJudgeSeesEveryMessage(t *testing.T) {
	var (
		mu     sync.Mutex
		judged []string
	)
	judge := func(method string) bool {
		mu.Lock()
		defer mu.Unlock()
		judged = append(judged, method)
		return method != "refused"
	}
	served := make(chan string, 8)
	ctx, srv, ws := rawClient(t, Options{Judge: judge, Handler: HandlerFunc(func(_ *Conn, r *Request) {
		served <- r.Method
		go r.Respond(json.RawMessage(`{}`))
	})})
	send := func(msg string) {
		t.Helper()
		if err := ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	answer := func(want string) {
		t.Helper()
		_, b, err := ws.Read(ctx)
		if err != nil || !strings.Contains(string(b), want) {
			t.Fatalf("answer %q, %v; want one with %s", b, err, want)
		}
	}
	send(`{"method":"a","correlation":{"id":"1","phase":"request"},"request":{}}`)
	answer(`"id":"1"`)
	send(`{"method":"b","correlation":{"id":"2","phase":"request"},"request":0}`) // malformed: answered by name
	answer(string(contracts.RelayRequestInvalid))
	send(`{"method":"c","correlation":{"id":"3","phase":"response"},"response":{}}`) // an answer: no call waits for it
	send(`{"method":"refused","correlation":{"id":"4","phase":"request"},"request":{}}`)
	if _, b, err := ws.Read(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("after a refused message the connection stays open: read %q, %v", b, err)
	}
	<-srv.Done()
	if err := context.Cause(srv.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("the connection ended with %v, want ErrClosed", err)
	}
	close(served)
	var got []string
	for m := range served {
		got = append(got, m)
	}
	if !slices.Equal(got, []string{"a"}) {
		t.Errorf("served %q, want only a", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"a", "", "", "refused"}; !slices.Equal(judged, want) {
		t.Errorf("judged %q, want %q", judged, want)
	}
}
