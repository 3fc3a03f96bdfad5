package quicsock

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// Conn is a UDP socket for quic-go: it implements quic.OOBCapablePacketConn, and ReadBatch,
// which quic-go uses when a socket has it.
type Conn struct {
	*net.UDPConn
	pc    *ipv4.PacketConn // set at construction
	gro   bool             // set at construction: the kernel coalesces received datagrams
	flows *flows           // set at construction

	mu     sync.Mutex
	fill   *batch     // guarded by mu: the batch writes go into
	space  *sync.Cond // on mu: signalled when the flusher takes a batch
	closed bool       // guarded by mu
	wake   chan struct{}
	done   chan struct{}
	exited chan struct{}
	gso    atomic.Bool // runs are coalesced into GSO messages; cleared after a GSO error

	spare *batch         // owned by the flusher: the batch being sent
	msgs  []ipv4.Message // owned by the flusher
	oobs  [][]byte       // owned by the flusher: control messages with UDP_SEGMENT
	bufs  [][][]byte     // owned by the flusher: the iovecs of each message

	rmsgs []ipv4.Message // owned by the reader: what recvmmsg(2) filled
	held  []segment      // owned by the reader: datagrams read and not yet handed over
	segs  []segment      // owned by the reader: backing for held
}

// New wraps c and starts its flusher. Close stops the flusher and closes c; Stop stops the
// flusher alone.
func New(c *net.UDPConn) *Conn {
	bc := &Conn{
		UDPConn: c, pc: ipv4.NewPacketConn(c), flows: newFlows(), fill: &batch{}, spare: &batch{},
		wake: make(chan struct{}, 1), done: make(chan struct{}), exited: make(chan struct{}),
		msgs: make([]ipv4.Message, batchLen), oobs: make([][]byte, batchLen), bufs: make([][][]byte, batchLen),
		rmsgs: make([]ipv4.Message, readBatch), segs: make([]segment, 0, readBatch*maxSegments),
	}
	bc.space = sync.NewCond(&bc.mu)
	bc.gso.Store(true)
	for i := range bc.oobs {
		bc.oobs[i] = make([]byte, 0, oobSize+unix.CmsgSpace(2))
	}
	for i := range bc.rmsgs {
		bc.rmsgs[i].Buffers = [][]byte{make([]byte, readBufSize)}
		bc.rmsgs[i].OOB = make([]byte, 128)
	}
	if raw, err := c.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) {
			bc.gro = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1) == nil
		})
	}
	go bc.flushLoop()
	return bc
}

// Flow registers the datagrams from addr, which one drain loop takes out of quic-go and reports
// with Flow.Drained; Flow.Close ends it.
func (c *Conn) Flow(addr netip.AddrPort) *Flow { return c.flows.flow(addr) }

// Stop ends the flusher, after it sent what is queued, without closing the socket. Writes fail
// from then on.
func (c *Conn) Stop() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.exited
		return
	}
	c.closed = true
	c.space.Broadcast()
	c.mu.Unlock()
	close(c.done)
	<-c.exited
}

// Close stops the flusher and closes the socket.
func (c *Conn) Close() error {
	c.Stop()
	return c.UDPConn.Close()
}
