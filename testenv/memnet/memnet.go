// Package memnet is an in-memory network for tests that run in a testing/synctest bubble: a
// connection's reads wait on a channel, so a goroutine waiting for bytes is durably blocked and
// the bubble's fake clock moves on, which a loopback socket's reader never lets it do.
package memnet

import (
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// Pipe is a connected pair of in-memory connections whose writes never block, as a TCP
// socket's buffers would take them (net.Pipe's writes wait for the reader: two read loops
// answering each other's pings on one would block each other for ever). Its reads wait on a
// channel, so a goroutine waiting for bytes is durably blocked in a synctest bubble.
func Pipe() (net.Conn, net.Conn) {
	a, b := newMemHalf(), newMemHalf()
	return &memConn{in: a, out: b}, &memConn{in: b, out: a}
}

// memHalf is one direction: bytes written and not read yet.
type memHalf struct {
	mu     sync.Mutex
	buf    []byte // guarded by mu
	closed bool   // guarded by mu
	// deadline is the reader's read deadline, zero for none; timer wakes the reader at it.
	deadline time.Time   // guarded by mu
	timer    *time.Timer // guarded by mu
	ready    chan struct{}
}

func newMemHalf() *memHalf { return &memHalf{ready: make(chan struct{}, 1)} }

func (h *memHalf) signal() {
	select {
	case h.ready <- struct{}{}:
	default:
	}
}

type memConn struct {
	in, out *memHalf
}

func (c *memConn) Read(p []byte) (int, error) {
	for {
		c.in.mu.Lock()
		if d := c.in.deadline; !d.IsZero() && !time.Now().Before(d) {
			c.in.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		if len(c.in.buf) > 0 {
			n := copy(p, c.in.buf)
			c.in.buf = c.in.buf[n:]
			more := len(c.in.buf) > 0
			c.in.mu.Unlock()
			if more {
				c.in.signal()
			}
			return n, nil
		}
		closed := c.in.closed
		c.in.mu.Unlock()
		if closed {
			return 0, io.EOF
		}
		<-c.in.ready
	}
}

func (c *memConn) Write(p []byte) (int, error) {
	c.out.mu.Lock()
	if c.out.closed {
		c.out.mu.Unlock()
		return 0, net.ErrClosed
	}
	c.out.buf = append(c.out.buf, p...)
	c.out.mu.Unlock()
	c.out.signal()
	return len(p), nil
}

func (c *memConn) Close() error {
	for _, h := range []*memHalf{c.in, c.out} {
		h.mu.Lock()
		h.closed = true
		h.mu.Unlock()
		h.signal()
	}
	return nil
}

func (c *memConn) LocalAddr() net.Addr           { return &net.TCPAddr{} }
func (c *memConn) RemoteAddr() net.Addr          { return &net.TCPAddr{} }
func (c *memConn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }

// SetReadDeadline wakes a waiting Read at t, which then fails with os.ErrDeadlineExceeded (an
// http.Server hijacking a connection sets one in the past to end its background read).
func (c *memConn) SetReadDeadline(t time.Time) error {
	h := c.in
	h.mu.Lock()
	h.deadline = t
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	if d := time.Until(t); !t.IsZero() && d > 0 {
		h.timer = time.AfterFunc(d, h.signal)
	}
	h.mu.Unlock()
	h.signal()
	return nil
}

// SetWriteDeadline does nothing: writes never block.
func (c *memConn) SetWriteDeadline(time.Time) error { return nil }

// Once is a listener that accepts c, then blocks until closed: an http.Server serving one
// connection.
func Once(c net.Conn) net.Listener { return &oneConn{c: c} }

// oneConn is a listener that accepts one connection, then blocks until closed.
type oneConn struct {
	mu     sync.Mutex
	c      net.Conn
	closed chan struct{}
}

func (l *oneConn) Accept() (net.Conn, error) {
	l.mu.Lock()
	c := l.c
	l.c = nil
	if l.closed == nil {
		l.closed = make(chan struct{})
	}
	closed := l.closed
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	<-closed
	return nil, net.ErrClosed
}
func (l *oneConn) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed == nil {
		l.closed = make(chan struct{})
	}
	select {
	case <-l.closed:
	default:
		close(l.closed)
	}
	return nil
}
func (l *oneConn) Addr() net.Addr { return &net.TCPAddr{} }
