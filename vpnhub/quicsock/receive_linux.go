package quicsock

import (
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

const (
	readBufSize = 65536 // a receive buffer: one GRO message of up to 64 segments
	readBatch   = 8     // messages one recvmmsg(2) takes
)

// segment is one datagram read from the kernel and not yet handed to quic-go.
type segment struct {
	data, oob []byte
	addr      net.Addr
	flags     int
	flow      *Flow // the registered flow it belongs to, or nil
}

// ReadBatch reads datagrams into ms, one per message, as ipv4.PacketConn.ReadBatch does: what the
// kernel coalesced is split again, and a flow's packets wait while its window is full. Only one
// goroutine may call it (quic-go's listen loop).
func (c *Conn) ReadBatch(ms []ipv4.Message, flags int) (int, error) {
	for len(c.held) == 0 { // never 0 messages and no error: quic-go would read a stale message
		if err := c.read(flags); err != nil {
			return 0, err
		}
	}
	k := 0
	for ; k < len(ms) && len(c.held) > 0; k++ {
		h := &c.held[0]
		if h.flow != nil && len(h.data) >= countedSize && h.data[0]&0x80 == 0 { // a 1-RTT packet
			if !c.flows.admit(h.flow, k == 0) {
				break // hand over what is ready; the next call waits
			}
		}
		ms[k].N = copy(ms[k].Buffers[0], h.data)
		ms[k].NN = copy(ms[k].OOB, h.oob)
		ms[k].Addr, ms[k].Flags = h.addr, h.flags
		if ms[k].N < len(h.data) {
			ms[k].Flags |= unix.MSG_TRUNC
		}
		c.held = c.held[1:]
	}
	return k, nil
}

// read fills held from one recvmmsg(2).
func (c *Conn) read(flags int) error {
	n, err := c.pc.ReadBatch(c.rmsgs, flags)
	if err != nil {
		return err
	}
	c.segs = c.segs[:0]
	for i := range n {
		m := &c.rmsgs[i]
		data, oob := m.Buffers[0][:m.N], m.OOB[:m.NN]
		var flow *Flow
		if u, ok := m.Addr.(*net.UDPAddr); ok {
			flow = c.flows.lookup(netip.AddrPortFrom(addrOf(u.IP), uint16(u.Port)))
		}
		size := len(data)
		if c.gro {
			if s := groSize(oob); s > 0 && s < size {
				size = s
			}
		}
		for len(data) > 0 {
			seg := data[:min(size, len(data))]
			data = data[len(seg):]
			c.segs = append(c.segs, segment{data: seg, oob: oob, addr: m.Addr, flags: m.Flags, flow: flow})
		}
	}
	c.held = c.segs
	return nil
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// groSize is the segment size of a UDP_GRO control message in oob, or 0.
func groSize(oob []byte) int {
	for len(oob) >= unix.CmsgSpace(0) {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.CmsgLen(0) || l > len(oob) {
			return 0
		}
		if h.Level == unix.IPPROTO_UDP && h.Type == unix.UDP_GRO && l >= unix.CmsgLen(4) {
			return int(*(*int32)(unsafe.Pointer(&oob[unix.CmsgSpace(0)])))
		}
		oob = oob[min(len(oob), unix.CmsgSpace(l-unix.CmsgLen(0))):]
	}
	return 0
}
