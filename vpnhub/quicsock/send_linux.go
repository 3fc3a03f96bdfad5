package quicsock

import (
	"bytes"
	"errors"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	batchLen    = 128   // datagrams a batch holds
	slotSize    = 1500  // the largest datagram a slot holds; quic-go's are at most 1452 bytes
	oobSize     = 64    // the largest control message a slot holds (packet info, ECN)
	maxSegments = 64    // UDP GSO's limit on segments per message (UDP_MAX_SEGMENTS)
	maxGSOBytes = 65000 // and on the bytes of one message
)

type slot struct {
	n, oobn int
	addr    *net.UDPAddr
	buf     [slotSize]byte
	oob     [oobSize]byte
}

type batch struct {
	n     int
	slots [batchLen]slot
}

// WriteMsgUDP queues one datagram and returns; the flusher sends it. A write that finds the batch
// full waits for the flusher, as a write to a full socket buffer would.
func (c *Conn) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (int, int, error) {
	if len(b) > slotSize || len(oob) > oobSize || addr == nil {
		return c.UDPConn.WriteMsgUDP(b, oob, addr) // quic-go's own GSO batches: never made for datagrams
	}
	c.mu.Lock()
	for c.fill.n == batchLen && !c.closed {
		c.space.Wait()
	}
	if c.closed {
		c.mu.Unlock()
		return 0, 0, net.ErrClosed
	}
	s := &c.fill.slots[c.fill.n]
	c.fill.n++
	first := c.fill.n == 1
	s.n, s.oobn, s.addr = copy(s.buf[:], b), copy(s.oob[:], oob), addr
	c.mu.Unlock()
	if first {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	return len(b), len(oob), nil
}

// WriteTo queues one datagram, as WriteMsgUDP.
func (c *Conn) WriteTo(b []byte, addr net.Addr) (int, error) {
	u, ok := addr.(*net.UDPAddr)
	if !ok {
		return c.UDPConn.WriteTo(b, addr)
	}
	n, _, err := c.WriteMsgUDP(b, nil, u)
	return n, err
}

// flushLoop sends batches until Stop, and what is queued then.
func (c *Conn) flushLoop() {
	defer close(c.exited)
	for {
		select {
		case <-c.wake:
		case <-c.done:
		}
		for {
			c.mu.Lock()
			if c.fill.n == 0 {
				c.mu.Unlock()
				break
			}
			c.fill, c.spare = c.spare, c.fill
			c.space.Broadcast()
			c.mu.Unlock()
			c.send(c.spare)
			c.spare.n = 0
		}
		select {
		case <-c.done:
			return
		default:
		}
	}
}

// send writes a batch with sendmmsg(2): a run of datagrams of one size to one address with one
// control message (the last may be shorter) is one GSO message.
func (c *Conn) send(b *batch) {
	gso := c.gso.Load()
	k := 0
	for i := 0; i < b.n; k++ {
		s := &b.slots[i]
		j, total := i+1, s.n
		for gso && j < b.n && j-i < maxSegments {
			q := &b.slots[j]
			if q.n > s.n || total+q.n > maxGSOBytes || !sameAddr(q.addr, s.addr) || !bytes.Equal(q.oob[:q.oobn], s.oob[:s.oobn]) {
				break
			}
			total += q.n
			j++
			if q.n < s.n {
				break
			}
		}
		bufs := c.bufs[k][:0]
		for x := i; x < j; x++ {
			bufs = append(bufs, b.slots[x].buf[:b.slots[x].n])
		}
		c.bufs[k] = bufs
		m := &c.msgs[k]
		m.Buffers, m.Addr, m.OOB = bufs, s.addr, s.oob[:s.oobn]
		if j-i > 1 {
			m.OOB = appendSegmentSize(append(c.oobs[k][:0], s.oob[:s.oobn]...), uint16(s.n))
			c.oobs[k] = m.OOB
		}
		i = j
	}
	for sent := 0; sent < k; {
		n, err := c.pc.WriteBatch(c.msgs[sent:k], 0)
		sent += n
		if err == nil {
			continue
		}
		if errors.Is(err, net.ErrClosed) {
			break
		}
		if m := &c.msgs[sent]; len(m.Buffers) > 1 && errors.Is(err, unix.EIO) {
			// EIO: the device cannot checksum a GSO message. Send this run one by one, and
			// every later one.
			c.gso.Store(false)
			oob := m.OOB[:len(m.OOB)-unix.CmsgSpace(2)]
			for _, p := range m.Buffers {
				c.UDPConn.WriteMsgUDP(p, oob, m.Addr.(*net.UDPAddr))
			}
		}
		sent++ // the message the kernel refused is dropped, as the network would
	}
	clear(c.msgs[:k])
}

func sameAddr(a, b *net.UDPAddr) bool {
	return a == b || (a.Port == b.Port && a.IP.Equal(b.IP) && a.Zone == b.Zone)
}

// appendSegmentSize appends a UDP_SEGMENT control message: the kernel cuts the message into
// datagrams of size bytes.
func appendSegmentSize(b []byte, size uint16) []byte {
	start := len(b)
	b = append(b, make([]byte, unix.CmsgSpace(2))...)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[start]))
	h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&b[start+unix.CmsgSpace(0)])) = size
	return b
}
