package vpnhub

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"strings"
	"testing"

	"github.com/flynn/noise"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub/internal/wire"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// startHandshake writes message 1 for node at a fixed timestamp.
func startHandshake(key *vpnkey.Pair, hub [32]byte, authority, node string, rng io.Reader) (*wire.Initiator, []byte, error) {
	return wire.StartHandshake(key, hub, authority, contracts.VPNHello{NodeID: node, Timestamp: 1}, rng)
}

func TestNoiseProtocolNameIsTheContracts(t *testing.T) {
	if got := wire.ProtocolName(); got != contracts.VPNNoiseProtocol {
		t.Fatalf("noise protocol %q, docs/protocol.md#vpn-hub says %q", got, contracts.VPNNoiseProtocol)
	}
}

func TestHandshakeAcceptsAMemberAndAgreesOnKeys(t *testing.T) {
	hub, cli := testKey(t, 1), testKey(t, 2)
	view := testView(testMember(cli, "node-a", 2))
	ini, msg1, err := startHandshake(&cli, hub.Public, "authority-1", "node-a", nil)
	if err != nil {
		t.Fatal(err)
	}
	acc, ref := respond(&hub, view, msg1, testNow, 1216, nil)
	if ref != nil {
		t.Fatalf("refused: %v", ref)
	}
	w, keys, err := ini.Finish(acc.msg2)
	if err != nil {
		t.Fatal(err)
	}
	if w.ControlAddress != netip.MustParseAddr("10.64.0.2") || w.MTU != 1216 || w.ExpiresAt != testNow+60_000 {
		t.Fatalf("welcome %+v", w)
	}
	if keys.Send != acc.keys.Recv || keys.Recv != acc.keys.Send || keys.Send == keys.Recv {
		t.Fatal("the two sides disagree on the transport keys")
	}
}

func TestHandshakeRefusalsByName(t *testing.T) {
	hub, cli, other := testKey(t, 1), testKey(t, 2), testKey(t, 3)
	member := testMember(cli, "node-a", 2)
	expired := member
	expired.ExpiresAt = testNow
	cases := []struct {
		name      string
		view      *membershipView
		key       vpnkey.Pair
		hubPublic [32]byte
		authority string
		node      string
		want      contracts.RefusalName
	}{
		{"no membership yet", nil, cli, hub.Public, "authority-1", "node-a", contracts.VPNMemberUnknown},
		{"unknown key", testView(member), other, hub.Public, "authority-1", "node-a", contracts.VPNMemberUnknown},
		{"another authority", testView(member), cli, hub.Public, "authority-2", "node-a", contracts.VPNAuthorityMismatch},
		{"another hub key", testView(member), cli, other.Public, "authority-1", "node-a", contracts.VPNAuthorityMismatch},
		{"claims another node", testView(member, testMember(other, "node-b", 3)), cli, hub.Public, "authority-1", "node-b", contracts.VPNMemberNodeMismatch},
		{"expired at expiresAt", testView(expired), cli, hub.Public, "authority-1", "node-a", contracts.VPNMemberExpired},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, msg1, err := startHandshake(&c.key, c.hubPublic, c.authority, c.node, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, ref := respond(&hub, c.view, msg1, testNow, 1216, nil)
			if ref == nil || !errors.Is(ref, c.want) || !strings.HasPrefix(ref.Error(), string(c.want)+": ") {
				t.Fatalf("refusal %v; want %s", ref, c.want)
			}
			priv := c.key.Private()
			if strings.Contains(ref.Error(), contracts.EncodeKey32(priv)) || strings.Contains(ref.Error(), contracts.EncodeKey32(hub.Private())) {
				t.Fatal("a refusal quotes a private key")
			}
		})
	}
}

func TestHandshakeRefusesGarbageAndANodelessPayload(t *testing.T) {
	hub, cli := testKey(t, 1), testKey(t, 2)
	view := testView(testMember(cli, "node-a", 2))
	for _, msg1 := range [][]byte{nil, {1}, bytes.Repeat([]byte{7}, 96), bytes.Repeat([]byte{0}, 200)} {
		if _, ref := respond(&hub, view, msg1, testNow, 1216, nil); !errors.Is(ref, contracts.VPNAuthorityMismatch) {
			t.Fatalf("garbage of %d bytes: %v", len(msg1), ref)
		}
	}
	// Valid Noise messages 1 from a member whose payload is not { nodeId, timestamp }; a member
	// the hub does not know is ignored (the shape is project-defined, so read tolerantly).
	for payload, ok := range map[string]bool{`{"nodeId":"node-a"}`: false, `{"nodeId":"node-a","timestamp":"1"}`: false,
		`[]`: false, `{"timestamp":5,"nodeId":"node-a","extra":1}`: true} {
		hs, _ := noise.NewHandshakeState(noise.Config{CipherSuite: wire.Suite, Pattern: noise.HandshakeIK, Initiator: true,
			Prologue: contracts.VPNHubPrologue("authority-1"), StaticKeypair: dhKey(cli), PeerStatic: hub.Public[:]})
		msg1, _, _, _ := hs.WriteMessage(nil, []byte(payload))
		acc, ref := respond(&hub, view, msg1, testNow, 1216, nil)
		switch {
		case ok && (ref != nil || acc.timestamp != 5):
			t.Fatalf("payload %s: %v %+v", payload, ref, acc)
		case !ok && !errors.Is(ref, contracts.VPNMemberNodeMismatch):
			t.Fatalf("payload %s: %v; want vpn-member-node-mismatch", payload, ref)
		}
	}
}

func TestInitiatorRefusesABadMessage2(t *testing.T) {
	hub, cli := testKey(t, 1), testKey(t, 2)
	ini, _, err := startHandshake(&cli, hub.Public, "authority-1", "node-a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ini.Finish(bytes.Repeat([]byte{9}, 80)); !errors.Is(err, wire.ErrHandshake) {
		t.Fatalf("garbage message 2: %v", err)
	}
}

func dhKey(k vpnkey.Pair) noise.DHKey {
	priv := k.Private()
	return noise.DHKey{Private: priv[:], Public: k.Public[:]}
}

// TestDataPathInteroperatesWithFlynnCipherStates checks docs/protocol.md#vpn-hub's data format against an
// independent implementation: flynn/noise's own transport CipherStates, driven by a handshake
// written here without the package's initiator. A datagram sealed by the fast path opens with
// flynn's Cipher().Decrypt at the counter it carries, and the reverse.
func TestDataPathInteroperatesWithFlynnCipherStates(t *testing.T) {
	hub, cli := testKey(t, 1), testKey(t, 2)
	view := testView(testMember(cli, "node-a", 2))
	hs, err := noise.NewHandshakeState(noise.Config{CipherSuite: noise.NewCipherSuite(noise.DH25519, noise.CipherChaChaPoly, noise.HashBLAKE2s),
		Pattern: noise.HandshakeIK, Initiator: true, Prologue: []byte("servezone-vpnhub:authority-1"),
		StaticKeypair: dhKey(cli), PeerStatic: hub.Public[:]})
	if err != nil {
		t.Fatal(err)
	}
	msg1, _, _, err := hs.WriteMessage(nil, []byte(`{"nodeId":"node-a","timestamp":1764561600123456}`))
	if err != nil {
		t.Fatal(err)
	}
	acc, ref := respond(&hub, view, msg1, testNow, 1216, nil)
	if ref != nil {
		t.Fatal(ref)
	}
	payload, toHub, fromHub, err := hs.ReadMessage(nil, acc.msg2)
	if err != nil {
		t.Fatal(err)
	}
	if string(payload) != `{"controlAddress":"10.64.0.2","mtu":1216,"expiresAt":1700000060000}` {
		t.Fatalf("message 2 payload %s", payload)
	}
	packet := []byte("an inner packet of some length")

	// Client → hub: flynn seals at counters 1 and 7; the hub's opener reads them.
	op := wire.NewOpener(acc.keys.Recv)
	for _, n := range []uint64{1, 7} {
		d := append(be64(n), toHub.Cipher().Encrypt(nil, n, nil, packet)...)
		got, verdict := op.Open(d)
		if verdict != wire.Opened || !bytes.Equal(got, packet) {
			t.Fatalf("counter %d: hub could not open flynn's datagram: %v", n, verdict)
		}
	}
	// Hub → client: the fast path seals at counters 1, 2; flynn opens them at the carried counter.
	se := wire.NewSealer(acc.keys.Send, 1216)
	for want := uint64(1); want <= 2; want++ {
		d, ok := se.Seal(packet)
		if !ok || len(d) != len(packet)+contracts.VPNDataOverhead {
			t.Fatalf("seal: %d bytes", len(d))
		}
		n := uint64(d[0])<<56 | uint64(d[1])<<48 | uint64(d[2])<<40 | uint64(d[3])<<32 | uint64(d[4])<<24 | uint64(d[5])<<16 | uint64(d[6])<<8 | uint64(d[7])
		if n != want {
			t.Fatalf("counter %d, want %d (counters start at 1)", n, want)
		}
		got, err := fromHub.Cipher().Decrypt(nil, n, nil, d[8:])
		if err != nil || !bytes.Equal(got, packet) {
			t.Fatalf("flynn could not open the fast path's datagram: %v", err)
		}
	}
}

func be64(n uint64) []byte {
	return []byte{byte(n >> 56), byte(n >> 48), byte(n >> 40), byte(n >> 32), byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
}
