// Command forwarder is the physical reference of the upstream benchmark (`go run ./bench -suites
// upstream`): the least a WebSocket multiplexer can do and still carry nodes' TypedRequest calls
// over one upstream socket correctly. It is built on the same WebSocket library as the relay
// (github.com/coder/websocket) and shares no code with it.
//
//	forwarder -listen 127.0.0.1:0 -upstream ws://127.0.0.1:4000/
//
// It dials the upstream once, accepts node sockets on every path, and forwards each request a
// node sends to the upstream and its answer back. Per frame it finds the correlation without
// decoding the envelope and rewrites its id, since every node counts its ids from 1 and they
// share one socket; nothing else is read, checked or changed. Like the relay it has a reader and
// a writer goroutine per socket, never blocks the upstream on a slow node (a node whose queue is
// full is closed), and sends the frames queued for the upstream at one moment with one write
// (the same user-space cork as the relay's upstream), so the two are compared on their work per
// request and not on their system calls. Requests from the upstream, answers from nodes and
// anything it cannot correlate are dropped: the benchmark sends none.
//
// It prints "listening <address>" on standard output once it accepts nodes.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/coder/websocket"
)

const (
	upstreamQueue = 4096      // frames waiting for the upstream writer
	nodeQueue     = 256       // answers waiting for one node's writer (the relay's nodeMaxQueue)
	readLimit     = 8 << 20   // the relay's default --max-message-bytes
	maxHeld       = 256 << 10 // bytes held back before a write, as the relay's cork
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "where nodes connect")
	upstream := flag.String("upstream", "", "the upstream's ws:// URL")
	flag.Parse()
	addr, done, err := start(*listen, *upstream)
	if err == nil {
		fmt.Printf("listening %s\n", addr)
		err = <-done
	}
	fmt.Fprintln(os.Stderr, "forwarder:", err)
	os.Exit(1)
}

// route is where an answer goes back: the node and the id it gave its request, quotes included.
type route struct {
	node *node
	id   []byte
}

type forwarder struct {
	up   *websocket.Conn // set at construction
	cork *corkConn       // set at construction: the socket under up
	out  chan []byte     // frames for the upstream writer

	nextID atomic.Uint64
	mu     sync.Mutex
	routes map[uint64]route // guarded by mu: upstream id → where its answer goes
}

type node struct {
	ws  *websocket.Conn
	out chan []byte   // answers for this node's writer
	end chan struct{} // closed when the node's reader has ended
}

// start dials the upstream and accepts nodes on listen; done reports why forwarding stopped.
func start(listen, upstream string) (addr net.Addr, done <-chan error, err error) {
	ctx := context.Background()
	var cork *corkConn
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			cork = &corkConn{Conn: c}
			return cork, nil
		}}}
	up, _, err := websocket.Dial(ctx, upstream, &websocket.DialOptions{HTTPClient: client})
	if err != nil {
		return nil, nil, fmt.Errorf("dial upstream: %w", err)
	}
	up.SetReadLimit(readLimit)
	f := &forwarder{up: up, cork: cork, out: make(chan []byte, upstreamQueue), routes: make(map[uint64]route)}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		up.CloseNow()
		return nil, nil, err
	}
	errc := make(chan error, 3)
	go func() { errc <- f.writeUpstream() }()
	go func() { errc <- f.readUpstream() }()
	go func() { errc <- http.Serve(ln, http.HandlerFunc(f.serveNode)) }()
	return ln.Addr(), errc, nil
}

// serveNode reads one node's requests and queues them for the upstream with their ids rewritten.
func (f *forwarder) serveNode(w http.ResponseWriter, r *http.Request) {
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(readLimit)
	n := &node{ws: ws, out: make(chan []byte, nodeQueue), end: make(chan struct{})}
	go n.write()
	defer close(n.end)
	defer ws.CloseNow()
	var id [24]byte
	for {
		_, b, err := ws.Read(context.Background())
		if err != nil {
			return
		}
		start, end, phase, ok := locate(b)
		if !ok || string(phase) != "request" {
			continue
		}
		up := f.nextID.Add(1)
		f.mu.Lock()
		f.routes[up] = route{node: n, id: append([]byte(nil), b[start:end]...)}
		f.mu.Unlock()
		f.out <- splice(b, start, end, quoted(id[:0], up))
	}
}

// readUpstream takes each answer back to the node that asked, under the id it gave.
func (f *forwarder) readUpstream() error {
	for {
		_, b, err := f.up.Read(context.Background())
		if err != nil {
			return fmt.Errorf("upstream: %w", err)
		}
		start, end, phase, ok := locate(b)
		if !ok || string(phase) != "response" || end-start < 3 {
			continue
		}
		up, err := strconv.ParseUint(string(b[start+1:end-1]), 10, 64)
		if err != nil {
			continue
		}
		f.mu.Lock()
		rt, ok := f.routes[up]
		delete(f.routes, up)
		f.mu.Unlock()
		if !ok {
			continue
		}
		select {
		case rt.node.out <- splice(b, start, end, rt.id):
		default:
			rt.node.ws.CloseNow() // the node reads nothing: it must not hold the upstream
		}
	}
}

// writeUpstream writes what is queued for the upstream; a burst leaves with one write.
func (f *forwarder) writeUpstream() error {
	for b := range f.out {
		runtime.Gosched() // let other nodes' readers join the burst, as the relay's send loop does
		f.cork.hold()
		err := f.up.Write(context.Background(), websocket.MessageText, b)
		for more := true; more && err == nil; {
			select {
			case b := <-f.out:
				err = f.up.Write(context.Background(), websocket.MessageText, b)
			default:
				more = false
			}
		}
		if ferr := f.cork.release(); err == nil {
			err = ferr
		}
		if err != nil {
			return fmt.Errorf("upstream: %w", err)
		}
	}
	return nil
}

func (n *node) write() {
	for {
		select {
		case b := <-n.out:
			if n.ws.Write(context.Background(), websocket.MessageText, b) != nil {
				return
			}
		case <-n.end:
			return
		}
	}
}

func quoted(dst []byte, id uint64) []byte {
	dst = append(dst, '"')
	dst = strconv.AppendUint(dst, id, 10)
	return append(dst, '"')
}

// corkConn holds writes back between hold and release and sends them with one write. Pings,
// pongs and close frames written by the library meanwhile join the held bytes in order.
type corkConn struct {
	net.Conn
	mu   sync.Mutex
	held bool   // guarded by mu
	buf  []byte // guarded by mu
}

func (c *corkConn) hold() {
	c.mu.Lock()
	c.held = true
	c.mu.Unlock()
}

func (c *corkConn) release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held = false
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	return err
}

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.held || len(c.buf)+len(p) > maxHeld {
		if len(c.buf) > 0 {
			if _, err := c.Conn.Write(c.buf); err != nil {
				return 0, err
			}
			c.buf = c.buf[:0]
		}
		return c.Conn.Write(p)
	}
	c.buf = append(c.buf, p...)
	return len(p), nil
}
