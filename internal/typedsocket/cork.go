package typedsocket

import (
	"net"
	"sync"
	"time"
)

// A CorkConn is a network connection whose writes can be held back and sent together, like
// TCP_CORK but in user space: the WebSocket library flushes every message with its own write
// system call, and a Conn built with Options.Cork writes a burst of queued messages with one.
// It pays on a multiplexed socket, where many peers' messages queue at once.
type CorkConn struct {
	net.Conn
	mu     sync.Mutex
	corked bool    // guarded by mu
	buf    *[]byte // guarded by mu: the held bytes, from corkBufs while corked
}

// closeFlushTimeout bounds how long Close tries to send the held bytes.
const closeFlushTimeout = 250 * time.Millisecond

// maxCorked bounds what a CorkConn holds back; beyond it the held bytes are written at once.
const maxCorked = 256 << 10

var corkBufs = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// NewCorkConn wraps c; it passes writes straight through until corked.
func NewCorkConn(c net.Conn) *CorkConn { return &CorkConn{Conn: c} }

// Cork holds back writes until Uncork.
func (c *CorkConn) Cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// Uncork writes what was held back, with one write, and passes later writes straight through.
func (c *CorkConn) Uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	return c.flush()
}

// Write implements net.Conn. Writes from several goroutines (the send loop, pings, pongs, the
// close frame) keep their order: each enters the held bytes or the socket under mu.
func (c *CorkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked {
		if err := c.flush(); err != nil {
			return 0, err
		}
		return c.Conn.Write(p)
	}
	if c.buf == nil {
		c.buf = corkBufs.Get().(*[]byte)
	}
	if len(*c.buf)+len(p) > maxCorked {
		if err := c.flush(); err != nil {
			return 0, err
		}
		return c.Conn.Write(p)
	}
	*c.buf = append(*c.buf, p...)
	return len(p), nil
}

// Close sends what is held back, as closing a socket sends what its kernel buffer holds, then
// closes. The WebSocket library closes the socket right after writing its reply to a peer's close
// frame, and that reply — with every frame of a burst the library counts as written — may be held
// here. A write blocked on a peer that reads nothing is cut short by a deadline: Close never waits
// more than closeFlushTimeout for it.
func (c *CorkConn) Close() error {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
	c.mu.Lock()
	c.corked = false
	_ = c.flush()
	c.mu.Unlock()
	return c.Conn.Close()
}

// flush writes the held bytes and returns the buffer to the pool, so an idle connection holds
// none. Called with mu held.
func (c *CorkConn) flush() error {
	if c.buf == nil {
		return nil
	}
	b := c.buf
	c.buf = nil
	_, err := c.Conn.Write(*b)
	if cap(*b) <= maxCorked {
		*b = (*b)[:0]
		corkBufs.Put(b)
	}
	return err
}
