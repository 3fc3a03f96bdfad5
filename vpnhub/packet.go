package vpnhub

import (
	"net/netip"

	"code.foss.global/serve.zone/relay/vpnhub/internal/wire"
)

// notUnicast reports a destination the hub never forwards: multicast (224.0.0.0/4), the limited
// broadcast address, or the control prefix's own broadcast address.
func notUnicast(dst, prefixBroadcast uint32) bool {
	return dst>>28 == 0xe || dst == 0xffffffff || dst == prefixBroadcast
}

// prefixBroadcast is the highest address of an IPv4 prefix.
func prefixBroadcast(p netip.Prefix) uint32 {
	if !p.IsValid() {
		return 0xffffffff
	}
	return wire.AddrU32(p.Addr()) | (uint32(1)<<(32-p.Bits()) - 1)
}
