package typedsocket

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"code.foss.global/serve.zone/relay/testenv/await"
)

// countingConn counts the writes that reach a real socket.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// tcpPair is a real loopback TCP connection: the near end counted, the far end plain.
func tcpPair(t *testing.T) (near *countingConn, far net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	far = <-accepted
	if far == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); far.Close() })
	return &countingConn{Conn: c}, far
}

func TestCorkConnHoldsWritesUntilUncorked(t *testing.T) {
	wire, far := tcpPair(t)
	cc := NewCorkConn(wire)
	write := func(s string) {
		t.Helper()
		if n, err := cc.Write([]byte(s)); err != nil || n != len(s) {
			t.Fatalf("write %q: %d, %v", s, n, err)
		}
	}

	write("a")
	if got := wire.writes.Load(); got != 1 {
		t.Fatalf("uncorked write reached the socket %d times, want 1", got)
	}
	cc.Cork()
	write("b")
	write("c")
	write("d")
	if got := wire.writes.Load(); got != 1 {
		t.Fatalf("corked writes reached the socket (%d writes), want them held", got)
	}
	if err := cc.Uncork(); err != nil {
		t.Fatal(err)
	}
	if got := wire.writes.Load(); got != 2 {
		t.Fatalf("uncork made %d writes, want 1", got-1)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(far, got); err != nil || string(got) != "abcd" {
		t.Fatalf("far end read %q, %v; want abcd in order", got, err)
	}

	// Past the bound the held bytes leave at once, in order, even while corked.
	cc.Cork()
	chunk := bytes.Repeat([]byte{'x'}, 64<<10)
	want := new(bytes.Buffer)
	read := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(far, int64(5*len(chunk)+1)))
		read <- b
	}()
	for i := range 5 {
		chunk[0] = byte('0' + i)
		want.Write(chunk)
		if _, err := cc.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	if wire.writes.Load() == 2 {
		t.Fatalf("%d KiB held while corked; the bound is %d KiB", 5*len(chunk)>>10, maxCorked>>10)
	}
	write("!")
	want.WriteString("!")
	if err := cc.Uncork(); err != nil {
		t.Fatal(err)
	}
	if b := <-read; !bytes.Equal(b, want.Bytes()) {
		t.Fatalf("far end read %d bytes out of order or incomplete, want %d", len(b), want.Len())
	}
}

// corkedPair is pair with both sockets wrapped in a CorkConn, counted below it. The client is
// returned unstarted so a test can queue a burst before its send loop runs.
func corkedPair(t *testing.T, srvOpts, cliOpts Options) (srv, cli *Conn, cliWire *countingConn) {
	t.Helper()
	type wireKey struct{}
	accepted := make(chan *Conn, 1)
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		opts := srvOpts
		opts.Cork = r.Context().Value(wireKey{}).(*CorkConn)
		c := New(ws, opts)
		accepted <- c
		c.Run(context.Background())
	}))
	hs.Listener = corkListener{hs.Listener}
	hs.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, wireKey{}, c)
	}
	hs.Start()

	var cork *CorkConn
	transport := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cliWire = &countingConn{Conn: c}
		cork = NewCorkConn(cliWire)
		return cork, nil
	}}
	ws, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(hs.URL, "http"), &websocket.DialOptions{HTTPClient: &http.Client{Transport: transport}})
	if err != nil {
		t.Fatal(err)
	}
	cliOpts.Cork = cork
	cli = New(ws, cliOpts)
	srv = <-accepted
	t.Cleanup(func() {
		cli.CloseNow()
		srv.CloseNow()
		<-cli.Done()
		<-srv.Done()
		hs.Close()
	})
	return srv, cli, cliWire
}

type corkListener struct{ net.Listener }

func (l corkListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return NewCorkConn(c), nil
}

// TestCorkedBurstLeavesInOneWrite: requests queued together leave in one write, arrive in the
// order they were queued, and every answer — sent corked by the server — arrives and stops
// counting as in flight.
func TestCorkedBurstLeavesInOneWrite(t *testing.T) {
	const n = 500
	var mu sync.Mutex
	var order []string
	srv, cli, wire := corkedPair(t, Options{MaxQueue: 2 * n, MaxInflight: 2 * n, Handler: HandlerFunc(func(_ *Conn, r *Request) {
		mu.Lock()
		order = append(order, string(r.Body))
		mu.Unlock()
		r.Respond(r.Body)
	})}, Options{MaxQueue: 2 * n})

	answers := make(chan error, n)
	for i := range n {
		body := fmt.Sprintf(`{"i":%d,"big":12345678901234567890}`, i)
		_, err := cli.CallAsync("echo", json.RawMessage(body), func(r Reply) {
			if r.Err == nil && string(r.Response) != body {
				r.Err = fmt.Errorf("call %d answered with %s", i, r.Response)
			}
			answers <- r.Err
		}, Timeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
	}
	before := wire.writes.Load()
	go cli.Run(context.Background())
	for range n {
		if err := <-answers; err != nil {
			t.Fatal(err)
		}
	}
	if got := wire.writes.Load() - before; got != 1 {
		t.Fatalf("a burst of %d queued requests took %d writes, want 1", n, got)
	}
	mu.Lock()
	for i, b := range order {
		if want := fmt.Sprintf(`{"i":%d,"big":12345678901234567890}`, i); b != want {
			t.Fatalf("request %d arrived as %s, want %s", i, b, want)
		}
	}
	mu.Unlock()
	await.Until(t, "the server to hold no request in flight after answering all", 5*time.Second, func() bool { return srv.Inflight() == 0 })
}
