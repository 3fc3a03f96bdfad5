package contracts

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func vpnKey(b byte) string { return EncodeKey32([32]byte{b, 1, 2, 3}) }

func validMembership() string {
	return `{"authorityId":"authority-1","controlPrefix":"10.64.0.0/16","generation":7,"members":[` +
		`{"nodeId":"node-a","publicKey":"` + vpnKey(1) + `","controlAddress":"10.64.0.2","expiresAt":1700000000000},` +
		`{"nodeId":"_node-b","publicKey":"` + vpnKey(2) + `","controlAddress":"10.64.0.3","expiresAt":0}]}`
}

func TestReadVPNMembershipPushAcceptsAValidPush(t *testing.T) {
	m, err := ReadVPNMembershipPush([]byte(validMembership()))
	if err != nil {
		t.Fatal(err)
	}
	if m.AuthorityID != "authority-1" || m.ControlPrefix != netip.MustParsePrefix("10.64.0.0/16") || m.Generation != 7 || len(m.Members) != 2 {
		t.Fatalf("read %+v", m)
	}
	if b := m.Members[1]; b.NodeID != "_node-b" || b.ControlAddress != netip.MustParseAddr("10.64.0.3") || b.PublicKey[0] != 2 {
		t.Fatalf("member %+v", b)
	}
	again, err := ReadVPNMembershipPush(EncodeVPNMembershipPush(m))
	if err != nil || !slices.Equal(again.Members, m.Members) || again.AuthorityID != m.AuthorityID {
		t.Fatalf("encode/read round trip: %+v, %v", again, err)
	}
	if _, err := ReadVPNMembershipPush([]byte(`{"authorityId":"a","controlPrefix":"192.168.7.0/24","generation":0,"members":[]}`)); err != nil {
		t.Fatalf("empty member list refused: %v", err)
	}
}

// The push is project-defined, so members the relay does not know are ignored, at the top and in
// each member (the reading rule of docs/protocol.md#sources-and-conventions: tolerant where this project guessed).
func TestReadVPNMembershipPushIgnoresUnknownMembers(t *testing.T) {
	want, err := ReadVPNMembershipPush([]byte(validMembership()))
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Replace(validMembership(), `{"authorityId"`, `{"schemaVersion":2,"hub":{"mtu":1200},"authorityId"`, 1)
	body = strings.Replace(body, `"expiresAt":0}`, `"expiresAt":0,"labels":["edge"],"expiresAt2":null}`, 1)
	got, err := ReadVPNMembershipPush([]byte(body))
	if err != nil || got.AuthorityID != want.AuthorityID || got.Generation != want.Generation || !slices.Equal(got.Members, want.Members) {
		t.Fatalf("push with unknown members: %+v, %v", got, err)
	}
	if g, ok := ReadVPNMembershipApplied([]byte(`{"appliedGeneration":7,"members":2}`)); !ok || g != 7 {
		t.Fatalf("answer with an unknown member: %d %v", g, ok)
	}
}

func TestReadVPNMembershipPushRefusesEachViolationByReason(t *testing.T) {
	base := validMembership()
	cases := []struct{ name, body, reason string }{
		{"missing key", `{"authorityId":"a","controlPrefix":"10.0.0.0/8","generation":1}`, "vpn membership must be an object carrying authorityId, controlPrefix, generation and members"},
		{"duplicate key", `{"authorityId":"a","authorityId":"b","controlPrefix":"10.0.0.0/8","generation":1,"members":[]}`, "vpn membership must be an object carrying"},
		{"authority", strings.Replace(base, `"authority-1"`, `"-bad"`, 1), "authorityId must be a canonical identifier"},
		{"public prefix", strings.Replace(base, `10.64.0.0/16`, `8.8.0.0/16`, 1), "controlPrefix must be a private IPv4 prefix"},
		{"prefix too long", strings.Replace(base, `10.64.0.0/16`, `10.64.0.0/31`, 1), "controlPrefix must be a private IPv4 prefix"},
		{"host bits", strings.Replace(base, `10.64.0.0/16`, `10.64.0.1/16`, 1), "controlPrefix must be a private IPv4 prefix"},
		{"wider than the private range", strings.Replace(base, `10.64.0.0/16`, `172.0.0.0/8`, 1), "controlPrefix must be a private IPv4 prefix"},
		{"ipv6", strings.Replace(base, `10.64.0.0/16`, `fd00::/64`, 1), "controlPrefix must be a private IPv4 prefix"},
		{"generation negative", strings.Replace(base, `"generation":7`, `"generation":-1`, 1), "generation must be a non-negative safe integer"},
		{"generation unsafe", strings.Replace(base, `"generation":7`, `"generation":9007199254740993`, 1), "generation must be a non-negative safe integer"},
		{"members not array", strings.Replace(base, `"members":[`, `"members":{"a":[`, 1) + "}", "members must be an array"},
		{"member shape", strings.Replace(base, `,"expiresAt":0}`, `}`, 1), "members[1] must be an object carrying nodeId, publicKey, controlAddress and expiresAt"},
		{"node id", strings.Replace(base, `"node-a"`, `"node a"`, 1), "members[0] nodeId must be a cluster node id"},
		{"node id twice", strings.Replace(base, `"_node-b"`, `"node-a"`, 1), "members[1] nodeId must be unique"},
		{"key", strings.Replace(base, vpnKey(1), vpnKey(1)+"=", 1), "members[0] publicKey must be a 32-byte key"},
		{"key twice", strings.Replace(base, vpnKey(2), vpnKey(1), 1), "members[1] publicKey must be unique"},
		{"address outside", strings.Replace(base, `10.64.0.2`, `10.65.0.2`, 1), "members[0] controlAddress must be an IPv4 host address inside controlPrefix"},
		{"network address", strings.Replace(base, `10.64.0.2`, `10.64.0.0`, 1), "members[0] controlAddress must be an IPv4 host address"},
		{"broadcast address", strings.Replace(base, `10.64.0.2`, `10.64.255.255`, 1), "members[0] controlAddress must be an IPv4 host address"},
		{"address leading zero", strings.Replace(base, `10.64.0.2`, `10.64.0.02`, 1), "members[0] controlAddress must be an IPv4 host address"},
		{"address twice", strings.Replace(base, `10.64.0.3`, `10.64.0.2`, 1), "members[1] controlAddress must be unique"},
		{"expiry", strings.Replace(base, `"expiresAt":0`, `"expiresAt":1.5`, 1), "members[1] expiresAt must be a non-negative safe integer"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadVPNMembershipPush([]byte(c.body))
			var inv *InvalidError
			if !errors.As(err, &inv) || len(inv.Reasons) != 1 || !strings.Contains(inv.Reasons[0], c.reason) {
				t.Fatalf("err = %v; want one reason containing %q", err, c.reason)
			}
		})
	}
}

func TestVPNControlPrefixAndAddresses(t *testing.T) {
	for s, want := range map[string]bool{
		"10.0.0.0/8": true, "172.16.0.0/12": true, "192.168.0.0/16": true, "10.1.2.4/30": true,
		"10.1.2.4/31": false, "9.0.0.0/8": false, "172.32.0.0/16": false, "0.0.0.0/0": false, "10.0.0.0/08": false,
	} {
		if _, ok := ReadVPNControlPrefix(s); ok != want {
			t.Errorf("ReadVPNControlPrefix(%q) = %v", s, ok)
		}
	}
	p := netip.MustParsePrefix("10.1.2.4/30")
	for s, want := range map[string]bool{"10.1.2.4": false, "10.1.2.5": true, "10.1.2.6": true, "10.1.2.7": false, "10.1.2.8": false} {
		if got := IsVPNControlAddress(p, netip.MustParseAddr(s)); got != want {
			t.Errorf("IsVPNControlAddress(%s) = %v", s, got)
		}
	}
}

func TestVPNHandshakePayloads(t *testing.T) {
	if string(VPNHubPrologue("auth-1")) != "servezone-vpnhub:auth-1" {
		t.Fatalf("prologue %q", VPNHubPrologue("auth-1"))
	}
	hello := VPNHello{NodeID: "-node", Timestamp: 1_764_561_600_123_456}
	if raw := EncodeVPNHello(hello); string(raw) != `{"nodeId":"-node","timestamp":1764561600123456}` {
		t.Fatalf("hello %s", raw)
	}
	if got, err := ReadVPNHello(EncodeVPNHello(hello)); err != nil || got != hello {
		t.Fatalf("hello round trip: %+v %v", got, err)
	}
	// Project-defined, so read tolerantly: a member the hub does not know is ignored.
	if got, err := ReadVPNHello([]byte(`{"v":2,"timestamp":7,"nodeId":"a","x":{}}`)); err != nil || got != (VPNHello{"a", 7}) {
		t.Fatalf("hello with extra members: %+v %v", got, err)
	}
	for _, bad := range []string{`{}`, `{"nodeId":"a"}`, `{"timestamp":1}`, `{"nodeId":"a","nodeId":"b","timestamp":1}`,
		`{"nodeId":"a b","timestamp":1}`, `{"nodeId":1,"timestamp":1}`, `{"nodeId":"a","timestamp":-1}`,
		`{"nodeId":"a","timestamp":1.5}`, `{"nodeId":"a","timestamp":9007199254740992}`, `[]`, ``} {
		if _, err := ReadVPNHello([]byte(bad)); err == nil {
			t.Errorf("hello %q accepted", bad)
		}
	}
	w := VPNWelcome{ControlAddress: netip.MustParseAddr("10.64.0.2"), MTU: 1216, ExpiresAt: 1700000000000}
	raw := EncodeVPNWelcome(w)
	if string(raw) != `{"controlAddress":"10.64.0.2","mtu":1216,"expiresAt":1700000000000}` {
		t.Fatalf("welcome %s", raw)
	}
	if got, err := ReadVPNWelcome(raw); err != nil || got != w {
		t.Fatalf("welcome round trip: %+v %v", got, err)
	}
	for _, bad := range []string{
		`{"controlAddress":"10.64.0.2","mtu":67,"expiresAt":1}`, `{"controlAddress":"10.64.0.2","mtu":65536,"expiresAt":1}`,
		`{"controlAddress":"::1","mtu":1200,"expiresAt":1}`, `{"controlAddress":"10.64.0.2","mtu":1200}`,
		`{"controlAddress":"10.64.0.2","mtu":1200,"expiresAt":-1}`, `[]`,
	} {
		if _, err := ReadVPNWelcome([]byte(bad)); err == nil {
			t.Errorf("welcome %s accepted", bad)
		}
	}
	if got, err := ReadVPNWelcome([]byte(`{"expiresAt":1,"next":[1],"mtu":1200,"controlAddress":"10.64.0.2"}`)); err != nil || got.MTU != 1200 {
		t.Fatalf("welcome with an extra member: %+v %v", got, err)
	}
	if g, ok := ReadVPNMembershipApplied(EncodeVPNMembershipApplied(42)); !ok || g != 42 {
		t.Fatalf("applied round trip %d %v", g, ok)
	}
}

// FuzzReadVPNMembershipPush checks that an accepted push encodes back to a body that reads the
// same.
func FuzzReadVPNMembershipPush(f *testing.F) {
	f.Add([]byte(validMembership()))
	f.Add([]byte(`{"authorityId":"a","controlPrefix":"10.0.0.0/30","generation":0,"members":[]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := ReadVPNMembershipPush(in)
		if err != nil {
			return
		}
		again, err := ReadVPNMembershipPush(EncodeVPNMembershipPush(m))
		if err != nil || again.AuthorityID != m.AuthorityID || again.ControlPrefix != m.ControlPrefix ||
			again.Generation != m.Generation || !slices.Equal(again.Members, m.Members) {
			t.Fatalf("round trip changed the push: %+v -> %+v (%v)", m, again, err)
		}
	})
}
