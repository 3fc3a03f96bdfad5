package typedsocket

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// A read that waits for room in the budget reads nothing, its peer's close included: without a
// watch, a peer that left would keep its place in line — and what it was charged — until a ping
// found it silent. So while a read waits, the socket is watched for its peer's close (FIN or
// reset), and the wait ends at once when it comes.

// closedChan is a done channel that is always closed: a charge that must not wait.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// errHungUp is the cause of a connection whose peer closed while its message waited for room.
var errHungUp = fmt.Errorf("%w: the peer closed while its message waited for room in the budget", ErrClosed)

// chargeIncoming charges n bytes of the message being received to share, waiting for room until
// the connection ends or its peer closes its socket (then the connection ends, false).
func (c *Conn) chargeIncoming(share Share, n int) bool {
	if share.ChargeIncoming(n, closedChan) {
		return true
	}
	if c.ctx.Err() != nil { // ending: no watch, whose end would undo a closing socket's deadline
		return false
	}
	gone, stop := watchHangup(c.opts.Raw)
	if gone == nil { // the socket cannot be watched: the connection's end alone ends the wait
		return share.ChargeIncoming(n, c.ctx.Done())
	}
	done := make(chan struct{})
	var once sync.Once
	end := func() { once.Do(func() { close(done) }) }
	unhook := context.AfterFunc(c.ctx, end)
	go func() {
		select {
		case <-gone:
			c.cancel(errHungUp)
			end()
		case <-done:
		}
	}()
	ok := share.ChargeIncoming(n, done)
	unhook()
	end()
	stop()
	return ok
}

// tcpOf is the TCP connection under c — through a TLS connection and any wrapper that tells its
// own (NetConn) — or nil.
func tcpOf(c net.Conn) *net.TCPConn {
	for range 8 {
		switch v := c.(type) {
		case *net.TCPConn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}
