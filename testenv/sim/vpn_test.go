package sim

import (
	"net/netip"
	"testing"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
)

func TestVPNMembershipBodyIsAValidPush(t *testing.T) {
	nodes, err := NewVPNNodes(netip.MustParsePrefix("10.88.0.0/29"), zerolog.Nop(), "n1", "n2", "n3")
	if err != nil {
		t.Fatal(err)
	}
	m, err := contracts.ReadVPNMembershipPush(VPNMembershipBody(SimVPNAuthority, netip.MustParsePrefix("10.88.0.0/29"), 4, 99, nodes))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Members) != 3 || m.Members[2].ControlAddress != netip.MustParseAddr("10.88.0.3") || m.Generation != 4 {
		t.Fatalf("push %+v", m)
	}
	if _, err := NewVPNNodes(netip.MustParsePrefix("10.88.0.0/30"), zerolog.Nop(), "a", "b", "c"); err == nil {
		t.Fatal("a /30 holds only two members")
	}
	if _, err := nodes[0].Send(nodes[1], 1, 100); err != ErrNotJoined {
		t.Fatalf("send before join: %v", err)
	}
}
