package vpnhub

import (
	"encoding/binary"
	"net/netip"
)

// The few facts the hub reads from an inner IP packet: its IPv4 source and destination. Nothing
// else of a packet is read, logged or kept.

// ipv4Addrs returns the source and destination of a well-formed IPv4 packet: version 4, a header
// of at least 20 bytes that fits, and a total length equal to the packet's. Anything else (IPv6, a
// truncated or padded packet) is not ok.
func ipv4Addrs(p []byte) (src, dst uint32, ok bool) {
	if len(p) < 20 || p[0]>>4 != 4 {
		return 0, 0, false
	}
	ihl := int(p[0]&0x0f) * 4
	if ihl < 20 || ihl > len(p) || int(binary.BigEndian.Uint16(p[2:4])) != len(p) {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(p[12:16]), binary.BigEndian.Uint32(p[16:20]), true
}

// notUnicast reports a destination the hub never forwards: multicast (224.0.0.0/4), the limited
// broadcast address, or the control prefix's own broadcast address.
func notUnicast(dst, prefixBroadcast uint32) bool {
	return dst>>28 == 0xe || dst == 0xffffffff || dst == prefixBroadcast
}

func addrU32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func u32Addr(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// prefixBroadcast is the highest address of an IPv4 prefix.
func prefixBroadcast(p netip.Prefix) uint32 {
	if !p.IsValid() {
		return 0xffffffff
	}
	return addrU32(p.Addr()) | (uint32(1)<<(32-p.Bits()) - 1)
}
