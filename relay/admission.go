package relay

import (
	"container/list"
	"crypto/tls"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"code.foss.global/serve.zone/relay/internal/budget"
)

// Admission at accept (docs/hostile.md, "Descriptors" and "No byte outside the budget"): every
// downstream connection counts against a descriptor cap from the moment it is accepted, its TLS
// handshake included, and its request headers are charged to the budget until it upgrades or
// closes. Past the cap the oldest connection that has not registered is closed to make room; when
// every open connection is registered, the new one is closed at accept. The reserve under the
// process's RLIMIT_NOFILE keeps the Cloudly dial, the token file, the hub, the registry and the
// admin listener working whatever the downstream does.

// fdReserve is how many descriptors the cap leaves to everything but downstream connections.
const fdReserve = 256

// headerCost is what an accepted connection holds before it upgrades: its request headers at
// most (MaxHeaderBytes, with the 4 KiB the HTTP server reads past it) and the server's read and
// write buffers (4 KiB each).
const headerCost = maxHeaderBytes + 4<<10 + 8<<10

// refusing bounds the connections being refused at accept at once (each reads and drops what its
// peer sent for at most refuseLinger, so that the peer reads the refusal rather than a reset);
// past it a connection is closed without a word.
const (
	refusing     = 64
	refuseLinger = time.Second
)

// refusedAtAccept is what a connection refused at accept is answered, once its request's head is read.
var refusedAtAccept = []byte("HTTP/1.1 503 Service Unavailable\r\nRetry-After: " + retryAfterSeconds +
	"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 40\r\n\r\nthe relay's peer memory budget is spent\n")

// admission counts the downstream's connections; a listener wraps every one it accepts.
type admission struct {
	max       int           // set before the listener accepts: connections open at once (the descriptor cap)
	headers   *budget.Share // set before the listener accepts: the unregistered connections' partition
	plaintext bool          // set before the listener accepts: no TLS above, a refusal can be spoken
	m         *metrics      // set at construction
	refusals  chan struct{} // set at construction: the refusals lingering now (refusing)
	rates     *sourceRates  // set before the listener accepts: upgrades per source under load; nil: none

	mu      sync.Mutex
	open    int       // guarded by mu
	waiting list.List // guarded by mu: the *admitted connections not registered yet, oldest first
}

// admitted is one accepted connection.
type admitted struct {
	net.Conn
	a       *admission    // set at construction
	elem    *list.Element // guarded by a.mu: its place in a.waiting; nil once registered or closed
	headers atomic.Int64  // its request headers' charge, until it upgrades or closes
	once    sync.Once
}

// listener admits the connections ln accepts.
type listener struct {
	net.Listener
	a *admission
}

func (l listener) Accept() (net.Conn, error) {
	for {
		yieldToQueued()
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if ac := l.a.admit(c); ac != nil {
			return ac, nil
		}
	}
}

// yieldToQueued lets the work already queued on the relay's processors run before another
// connection is accepted: it yields, and when it waited for a turn (the processors were busy),
// it waits as long again before it goes on. Connections then wait in the kernel's accept queue
// while the relay has work, and the nodes' requests, already read, are served before the next
// connection's request is (docs/hostile.md, "Refusal before work").
func yieldToQueued() {
	start := time.Now()
	runtime.Gosched()
	if d := time.Since(start); d > acceptYield {
		time.Sleep(min(d, maxAcceptPause))
	}
}

// acceptYield is the wait for a turn that counts as busy; maxAcceptPause bounds the pause after it.
const (
	acceptYield    = 200 * time.Microsecond
	maxAcceptPause = 10 * time.Millisecond
)

// admit counts c in, or closes it and returns nil.
func (a *admission) admit(c net.Conn) net.Conn {
	if a.rates != nil && a.pressed() && !a.rates.allow(sourceOf(c.RemoteAddr().String()), time.Now()) {
		// Under load, past its source's bucket: closed before TLS, the request or the upgrade
		// cost anything (pressure.go).
		a.m.unregistered.WithLabelValues("rate").Inc()
		c.Close()
		return nil
	}
	a.mu.Lock()
	var oldest *admitted
	if a.open >= a.max {
		if e := a.waiting.Front(); e != nil {
			oldest = e.Value.(*admitted)
			a.waiting.Remove(e)
			oldest.elem = nil
		}
	}
	if a.open >= a.max && oldest == nil {
		a.mu.Unlock()
		a.m.unregistered.WithLabelValues("descriptors").Inc()
		c.Close()
		return nil
	}
	ac := &admitted{Conn: c, a: a}
	a.open++
	ac.elem = a.waiting.PushBack(ac)
	a.mu.Unlock()
	if oldest != nil {
		a.m.unregistered.WithLabelValues("descriptors-oldest").Inc()
		oldest.Close() // its count is given back when it closes
	}
	if !a.headers.Charge(headerCost) {
		// The unregistered connections' part of the budget is spent: refused as an upgrade past it
		// is, 503 with Retry-After, where the connection speaks plain HTTP.
		a.m.unregistered.WithLabelValues("budget").Inc()
		a.refuse(ac)
		return nil
	}
	ac.headers.Store(headerCost)
	return ac
}

// refuse answers ac 503 and closes it, reading and dropping what its peer sends meanwhile, at
// most refuseLinger; over TLS, or with refusing of them under way already, it only closes it.
func (a *admission) refuse(ac *admitted) {
	if !a.plaintext {
		ac.Close()
		return
	}
	select {
	case a.refusals <- struct{}{}:
	default:
		ac.Close()
		return
	}
	go func() {
		defer func() { <-a.refusals }()
		defer ac.Close()
		ac.SetDeadline(time.Now().Add(refuseLinger))
		// The request is read (and dropped) first: a client that is still writing it would take
		// an answer before its request for a response on an idle connection and discard it.
		if !skipRequestHead(ac) {
			return
		}
		if _, err := ac.Write(refusedAtAccept); err != nil {
			return
		}
		if tc, ok := ac.Conn.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		io.Copy(io.Discard, io.LimitReader(ac, maxHeaderBytes))
	}()
}

// skipRequestHead reads and drops r's bytes through the blank line that ends a request's head,
// at most maxHeaderBytes of them, in a buffer of its own size; false if r ended or failed first.
// A request that has not ended its head by then is answered all the same.
func skipRequestHead(r io.Reader) bool {
	var buf [512]byte
	var tail uint32 // the last four bytes read, the newest lowest
	for n := 0; n < maxHeaderBytes; {
		k, err := r.Read(buf[:])
		for _, b := range buf[:k] {
			if tail = tail<<8 | uint32(b); tail == 0x0d0a0d0a {
				return true
			}
		}
		n += k
		if err != nil {
			return false
		}
	}
	return true
}

// upgraded: the connection's request is read; its headers are charged no more.
func (ac *admitted) upgraded() {
	if n := ac.headers.Swap(0); n > 0 {
		ac.a.headers.Release(int(n))
	}
}

// becomeUnregistered hands cost of the headers' charge over to the connection's upgrade: it is
// now an unregistered WebSocket, whose cost its owner releases; the rest is released. It reports
// false, handing nothing over, for a nil connection or one whose charge is gone.
func (ac *admitted) becomeUnregistered(cost int64) bool {
	if ac == nil {
		return false
	}
	n := ac.headers.Swap(0)
	if n < cost {
		if n > 0 {
			ac.a.headers.Release(int(n))
		}
		return false
	}
	if n > cost {
		ac.a.headers.Release(int(n - cost))
	}
	return true
}

// registered: the connection carries a node or an ingress; it is never closed to make room.
func (ac *admitted) registered() {
	ac.a.mu.Lock()
	if ac.elem != nil {
		ac.a.waiting.Remove(ac.elem)
		ac.elem = nil
	}
	ac.a.mu.Unlock()
}

// Close closes the connection and gives back its place, once.
func (ac *admitted) Close() error {
	ac.once.Do(func() {
		ac.upgraded()
		ac.a.mu.Lock()
		ac.a.open--
		if ac.elem != nil {
			ac.a.waiting.Remove(ac.elem)
			ac.elem = nil
		}
		ac.a.mu.Unlock()
	})
	return ac.Conn.Close()
}

// NetConn is the accepted socket: a waiting read watches it for its peer's close.
func (ac *admitted) NetConn() net.Conn { return ac.Conn }

// admittedOf is the admitted connection under c (a TLS connection's included), or nil.
func admittedOf(c net.Conn) *admitted {
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	ac, _ := c.(*admitted)
	return ac
}

// openConns is the number of downstream connections open now.
func (a *admission) openConns() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.open
}
