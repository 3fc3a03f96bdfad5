package client

import (
	"encoding/binary"
	"math/bits"
)

// TCP segmentation and coalescing for a TUN with offloads (virtio-net headers, TSO4): the kernel
// hands the client 64 KiB TCP super-packets, which segmentTCP4 cuts into MTU-sized IPv4 packets,
// and coalesceTCP4 merges a burst of received segments of one flow back into a super-packet the
// kernel takes in one write. Both work on plain byte slices, so they are tested without a TUN.
// Only IPv4 without IP options is touched; anything else passes through one packet at a time.

// virtioNetHdr is struct virtio_net_hdr, little-endian, as a TUN with IFF_VNET_HDR reads and
// writes it before every packet.
type virtioNetHdr struct {
	flags      uint8
	gsoType    uint8
	hdrLen     uint16
	gsoSize    uint16
	csumStart  uint16
	csumOffset uint16
}

const (
	virtioNetHdrLen      = 10
	virtioNeedsCsum      = 1    // VIRTIO_NET_HDR_F_NEEDS_CSUM
	virtioGSONone        = 0    // VIRTIO_NET_HDR_GSO_NONE
	virtioGSOTCPv4       = 1    // VIRTIO_NET_HDR_GSO_TCPV4
	virtioGSOECN         = 0x80 // VIRTIO_NET_HDR_GSO_ECN
	maxCoalescedSegments = 64
	maxIPv4Packet        = 65535
)

func (h *virtioNetHdr) decode(b []byte) {
	h.flags, h.gsoType = b[0], b[1]
	h.hdrLen = binary.LittleEndian.Uint16(b[2:])
	h.gsoSize = binary.LittleEndian.Uint16(b[4:])
	h.csumStart = binary.LittleEndian.Uint16(b[6:])
	h.csumOffset = binary.LittleEndian.Uint16(b[8:])
}

func (h *virtioNetHdr) encode(b []byte) {
	b[0], b[1] = h.flags, h.gsoType
	binary.LittleEndian.PutUint16(b[2:], h.hdrLen)
	binary.LittleEndian.PutUint16(b[4:], h.gsoSize)
	binary.LittleEndian.PutUint16(b[6:], h.csumStart)
	binary.LittleEndian.PutUint16(b[8:], h.csumOffset)
}

// sum16 adds b to the ones' complement sum acc, eight bytes at a time, without folding.
func sum16(b []byte, acc uint64) uint64 {
	var carry uint64
	for len(b) >= 8 {
		acc, carry = bits.Add64(acc, uint64(binary.BigEndian.Uint32(b))<<32|uint64(binary.BigEndian.Uint32(b[4:])), carry)
		b = b[8:]
	}
	acc += carry
	fold := func(a uint64) uint64 { return (a >> 32) + (a & 0xffffffff) }
	acc = fold(fold(acc))
	for len(b) >= 2 {
		acc += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		acc += uint64(b[0]) << 8
	}
	return acc
}

// fold16 folds a sum to 16 bits (not complemented).
func fold16(acc uint64) uint16 {
	for acc > 0xffff {
		acc = (acc >> 16) + (acc & 0xffff)
	}
	return uint16(acc)
}

// pseudoSum4 is the TCP/UDP pseudo-header sum of an IPv4 packet for a transport length.
func pseudoSum4(ip []byte, proto byte, length int) uint64 {
	return sum16(ip[12:20], uint64(proto)+uint64(length))
}

func setIPv4Checksum(ip []byte, ihl int) {
	ip[10], ip[11] = 0, 0
	binary.BigEndian.PutUint16(ip[10:], ^fold16(sum16(ip[:ihl], 0)))
}

// finishChecksum completes a CHECKSUM_PARTIAL packet: the field at start+offset holds the
// pseudo-header sum; the result is the complement of the sum from start on.
func finishChecksum(p []byte, start, offset int) bool {
	if start+offset+2 > len(p) {
		return false
	}
	binary.BigEndian.PutUint16(p[start+offset:], ^fold16(sum16(p[start:], 0)))
	return true
}

// tcp4Headers returns the IPv4 and TCP header lengths of an option-free IPv4 TCP packet.
func tcp4Headers(p []byte) (ihl, thl int, ok bool) {
	if len(p) < 40 || p[0] != 0x45 || p[9] != 6 || int(binary.BigEndian.Uint16(p[2:])) != len(p) {
		return 0, 0, false
	}
	thl = int(p[20+12]>>4) * 4
	if thl < 20 || 20+thl > len(p) {
		return 0, 0, false
	}
	return 20, thl, true
}

// TCP flag bits.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpURG = 0x20
	tcpCWR = 0x80
)

// segmentTCP4 cuts the TSO super-packet p into segments of mss payload bytes, appended to out
// and backed by buf (which needs room for all of them). It returns ok false for a packet it
// cannot cut.
func segmentTCP4(p []byte, mss int, buf []byte, out [][]byte) ([][]byte, bool) {
	ihl, thl, ok := tcp4Headers(p)
	if !ok || mss <= 0 {
		return out, false
	}
	hl := ihl + thl
	payload := p[hl:]
	seq := binary.BigEndian.Uint32(p[ihl+4:])
	id := binary.BigEndian.Uint16(p[4:])
	flags := p[ihl+13]
	n := (len(payload) + mss - 1) / mss
	if n == 0 || n*hl+len(payload) > len(buf) {
		return out, false
	}
	for i, off := 0, 0; off < len(payload); i, off = i+1, off+mss {
		end := min(off+mss, len(payload))
		seg := buf[:hl+end-off]
		buf = buf[len(seg):]
		copy(seg, p[:hl])
		copy(seg[hl:], payload[off:end])
		binary.BigEndian.PutUint16(seg[2:], uint16(len(seg)))
		binary.BigEndian.PutUint16(seg[4:], id+uint16(i))
		setIPv4Checksum(seg, ihl)
		binary.BigEndian.PutUint32(seg[ihl+4:], seq+uint32(off))
		f := flags
		if end < len(payload) {
			f &^= tcpFIN | tcpPSH
		}
		if i > 0 {
			f &^= tcpCWR
		}
		seg[ihl+13] = f
		seg[ihl+16], seg[ihl+17] = 0, 0
		tcp := seg[ihl:]
		binary.BigEndian.PutUint16(tcp[16:], ^fold16(sum16(tcp, pseudoSum4(seg, 6, len(tcp)))))
		out = append(out, seg)
	}
	return out, true
}

// canFollow reports whether TCP segment q continues the coalesced run whose first packet is
// first, whose last packet is last and whose payload so far is size bytes, each gso bytes: same
// flow and headers but for the sequence number, checksum and IP id, contiguous, and still
// within one IPv4 packet.
func canFollow(first, last, q []byte, gso, size, count int) bool {
	_, thl, ok := tcp4Headers(q)
	if !ok || count >= maxCoalescedSegments {
		return false
	}
	hl := 20 + thl
	if hl != 20+int(first[32]>>4)*4 || len(q)-hl > gso || len(q) == hl || len(first)+size+len(q)-hl-gso > maxIPv4Packet {
		return false
	}
	if len(last)-hl != gso { // only the last segment of a run may be short
		return false
	}
	lastFlags := last[33]
	if lastFlags&tcpPSH != 0 || q[33]&(tcpFIN|tcpSYN|tcpRST|tcpURG|tcpCWR) != 0 {
		return false
	}
	// IPv4: version, IHL, TOS, flags and TTL, protocol and addresses agree.
	if first[1] != q[1] || first[6]&0xe0 != q[6]&0xe0 || first[8] != q[8] || string(first[12:20]) != string(q[12:20]) {
		return false
	}
	// TCP: ports, ack, window, flags (but PSH), urgent pointer and options agree.
	if string(first[20:24]) != string(q[20:24]) || string(first[28:32]) != string(q[28:32]) ||
		(first[33]^q[33])&^tcpPSH != 0 || string(first[34:36]) != string(q[34:36]) ||
		string(first[38:hl]) != string(q[38:hl]) {
		return false
	}
	return binary.BigEndian.Uint32(last[24:])+uint32(len(last)-hl) == binary.BigEndian.Uint32(q[24:])
}

// coalesceTCP4 writes the packets bufs[i][offset:] to write, merging runs of adjacent segments of
// one TCP flow into super-packets with a virtio-net header asking the kernel to segment and
// checksum them (GSO TCPv4). Every other packet goes alone with an empty header. buf must hold
// 10+65535 bytes.
func coalesceTCP4(bufs [][]byte, offset int, buf []byte, write func([]byte) error) error {
	var held [maxCoalescedSegments][]byte
	for len(bufs) > 0 {
		n := min(len(bufs), len(held))
		pkts := held[:n]
		for i := range pkts {
			pkts[i] = bufs[i][offset:]
		}
		bufs = bufs[n:]
		if err := coalesceRun(pkts, buf, write); err != nil {
			return err
		}
	}
	return nil
}

func coalesceRun(pkts [][]byte, buf []byte, write func([]byte) error) error {
	for i := 0; i < len(pkts); {
		first := pkts[i]
		j := i + 1
		ihl, thl, ok := tcp4Headers(first)
		if ok && len(first) > ihl+thl {
			gso, size := len(first)-ihl-thl, len(first)-ihl-thl
			last := first
			for j < len(pkts) && canFollow(first, last, pkts[j], gso, size, j-i) {
				last = pkts[j]
				size += len(last) - ihl - thl
				j++
			}
		}
		var h virtioNetHdr
		if j == i+1 {
			h.encode(buf)
			n := copy(buf[virtioNetHdrLen:], first)
			if err := write(buf[:virtioNetHdrLen+n]); err != nil {
				return err
			}
			i = j
			continue
		}
		hl := ihl + thl
		out := buf[virtioNetHdrLen:]
		n := copy(out, first)
		for _, q := range pkts[i+1 : j] {
			n += copy(out[n:], q[hl:])
		}
		sp := out[:n]
		binary.BigEndian.PutUint16(sp[2:], uint16(n))
		setIPv4Checksum(sp, ihl)
		sp[ihl+13] |= pkts[j-1][ihl+13] & tcpPSH
		binary.BigEndian.PutUint16(sp[ihl+16:], fold16(pseudoSum4(sp, 6, n-ihl)))
		h = virtioNetHdr{flags: virtioNeedsCsum, gsoType: virtioGSOTCPv4, hdrLen: uint16(hl),
			gsoSize: uint16(len(first) - hl), csumStart: uint16(ihl), csumOffset: 16}
		h.encode(buf)
		if err := write(buf[:virtioNetHdrLen+n]); err != nil {
			return err
		}
		i = j
	}
	return nil
}
