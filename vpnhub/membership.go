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
	members     []contracts.VPNMember // in the push's order: what replication copies
}

func newMembershipView(m contracts.VPNMembership) *membershipView {
	v := &membershipView{
		authorityID: m.AuthorityID, prologue: contracts.VPNHubPrologue(m.AuthorityID),
		prefix: m.ControlPrefix, broadcast: prefixBroadcast(m.ControlPrefix), generation: m.Generation,
		byKey: make(map[[32]byte]contracts.VPNMember, len(m.Members)), members: m.Members,
	}
	for _, mem := range m.Members {
		v.byKey[mem.PublicKey] = mem
	}
	return v
}

// lookup is the member with key in v; a nil view holds none.
func (v *membershipView) lookup(key [32]byte) (contracts.VPNMember, bool) {
	if v == nil {
		return contracts.VPNMember{}, false
	}
	m, ok := v.byKey[key]
	return m, ok
}
