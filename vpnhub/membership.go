package vpnhub

import (
	"net/netip"

	"code.foss.global/serve.zone/relay/contracts"
)

// membershipView is one generation of pushClusterVpnMembership as the handshake judges it. It is
// immutable once published: the hub swaps the whole view on a newer generation.
type membershipView struct {
	authorityID string
	prologue    []byte
	prefix      netip.Prefix
	broadcast   uint32 // the prefix's broadcast address
	generation  int64
	byKey       map[[32]byte]contracts.VPNMember
}

func newMembershipView(m contracts.VPNMembership) *membershipView {
	v := &membershipView{
		authorityID: m.AuthorityID, prologue: contracts.VPNHubPrologue(m.AuthorityID),
		prefix: m.ControlPrefix, broadcast: prefixBroadcast(m.ControlPrefix), generation: m.Generation,
		byKey: make(map[[32]byte]contracts.VPNMember, len(m.Members)),
	}
	for _, mem := range m.Members {
		v.byKey[mem.PublicKey] = mem
	}
	return v
}
