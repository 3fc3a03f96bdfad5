package vpnhub

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/flynn/noise"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub/internal/wire"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// Fuzz targets for everything a peer can send the hub or the client: framed handshake messages,
// the JSON payloads inside them, and data datagrams. Seed corpora are in testdata/fuzz; set
// VPNHUB_WRITE_SEEDS=1 to write them again from seedInputs.

// detRand is a deterministic randomness source, so seeds and failures reproduce.
type detRand struct{ r *rand.ChaCha8 }

func newDetRand(seed byte) *detRand { return &detRand{rand.NewChaCha8([32]byte{seed})} }

func (d *detRand) Read(p []byte) (int, error) { return d.r.Read(p) }

func frame(msg []byte) []byte {
	return append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...)
}

// FuzzHandshakeMessage feeds a framed message 1 to the hub's reader and responder. Whatever the
// bytes, the answer is an acceptance or a refusal under one of the docs/protocol.md#vpn-hub names, never a panic.
func FuzzHandshakeMessage(f *testing.F) {
	hub, cli := testKey(f, 1), testKey(f, 2)
	view := testView(testMember(cli, "node-a", 2))
	for _, s := range seedInputs(f)["FuzzHandshakeMessage"] {
		f.Add(s[0])
	}
	f.Fuzz(func(t *testing.T, framed []byte) {
		msg1, err := wire.ReadFrame(bytes.NewReader(framed), wire.MaxHandshakeMessage)
		if err != nil {
			return
		}
		acc, ref := respond(&hub, view, msg1, testNow, 1216, newDetRand(1))
		if ref != nil {
			switch ref.Name {
			case contracts.VPNAuthorityMismatch, contracts.VPNMemberUnknown, contracts.VPNMemberNodeMismatch, contracts.VPNMemberExpired:
			default:
				t.Fatalf("refusal outside the handshake's names: %v", ref)
			}
			return
		}
		if acc.member.NodeID != "node-a" || len(acc.msg2) == 0 {
			t.Fatalf("accepted %+v", acc.member)
		}
	})
}

// FuzzHandshakePayload carries fuzzed payloads through real Noise messages: message 1's
// { nodeId, timestamp } to the hub, and message 2's { controlAddress, mtu, expiresAt } to the
// client. The hub accepts exactly the payload naming the member's node; the client accepts
// exactly what ReadVPNWelcome reads.
func FuzzHandshakePayload(f *testing.F) {
	hub, cli := testKey(f, 1), testKey(f, 2)
	view := testView(testMember(cli, "node-a", 2))
	for _, s := range seedInputs(f)["FuzzHandshakePayload"] {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, hello, welcome []byte) {
		if len(hello) > 512 || len(welcome) > 512 {
			return
		}
		ini, err := noise.NewHandshakeState(noise.Config{CipherSuite: wire.Suite, Random: newDetRand(2), Pattern: noise.HandshakeIK,
			Initiator: true, Prologue: contracts.VPNHubPrologue(testAuthority), StaticKeypair: dhKey(cli), PeerStatic: hub.Public[:]})
		if err != nil {
			t.Fatal(err)
		}
		msg1, _, _, err := ini.WriteMessage(nil, hello)
		if err != nil {
			t.Fatal(err)
		}
		_, ref := respond(&hub, view, msg1, testNow, 1216, newDetRand(3))
		h, herr := contracts.ReadVPNHello(hello)
		if wantOK := herr == nil && h.NodeID == "node-a"; (ref == nil) != wantOK {
			t.Fatalf("hello %q: refusal %v, reader says %+v %v", hello, ref, h, herr)
		}
		if ref != nil && !errors.Is(ref, contracts.VPNMemberNodeMismatch) {
			t.Fatalf("hello %q refused as %v", hello, ref)
		}

		// Message 2 with the fuzzed welcome, from a responder written here.
		res, _ := noise.NewHandshakeState(noise.Config{CipherSuite: wire.Suite, Random: newDetRand(4), Pattern: noise.HandshakeIK,
			Prologue: contracts.VPNHubPrologue(testAuthority), StaticKeypair: dhKey(hub)})
		c, m1, err := startHandshake(&cli, hub.Public, testAuthority, "node-a", newDetRand(5))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := res.ReadMessage(nil, m1); err != nil {
			t.Fatal(err)
		}
		m2, _, _, err := res.WriteMessage(nil, welcome)
		if err != nil {
			t.Fatal(err)
		}
		w, _, err := c.Finish(m2)
		want, werr := contracts.ReadVPNWelcome(welcome)
		if (err == nil) != (werr == nil) || (err == nil && w != want) {
			t.Fatalf("welcome %q: client read %+v %v, reader %+v %v", welcome, w, err, want, werr)
		}
		if err == nil && !bytes.Equal(contracts.EncodeVPNWelcome(w), contracts.EncodeVPNWelcome(want)) {
			t.Fatal("welcome does not re-encode the same")
		}
	})
}

// FuzzDatagram feeds the hub's data plane: raw bytes straight from a member, and a fuzzed inner
// packet sealed with a fuzzed counter. Raw bytes never authenticate; a sealed packet is forwarded
// exactly when it is IPv4 from the member's address to the other member, unchanged.
func FuzzDatagram(f *testing.F) {
	for _, s := range seedInputs(f)["FuzzDatagram"] {
		f.Add(s[0], s[1], binary.BigEndian.Uint64(s[2]))
	}
	f.Fuzz(func(t *testing.T, raw, packet []byte, counter uint64) {
		p := newPlane(t, 4)
		p.h.forward(p.a, bytes.Clone(raw))
		if p.b.queue.len() != 0 { // forging a tag is out of reach: the AEAD was bypassed
			t.Fatalf("raw datagram %x was forwarded", raw)
		}
		p.aSend.SetCounter(counter - 1)
		d, ok := p.aSend.Seal(packet)
		if !ok {
			return
		}
		p.h.forward(p.a, bytes.Clone(d))
		got := p.b.queue.pop()
		src, dst, isV4 := wire.IPv4Addrs(packet)
		wantForward := counter != 0 && counter < 1<<64-1 && isV4 && src == wire.AddrU32(addrA) && dst == wire.AddrU32(addrB) && len(packet) <= p.b.mtu
		if (got != nil) != wantForward {
			t.Fatalf("counter %d packet %x: forwarded %v, want %v", counter, packet, got != nil, wantForward)
		}
		if got != nil && !bytes.Equal(got, packet) {
			t.Fatal("the packet changed on its way")
		}
	})
}

// seedInputs are the seed corpora, also written to testdata/fuzz when VPNHUB_WRITE_SEEDS is set.
func seedInputs(f *testing.F) map[string][][][]byte {
	hub, cli, other := testKey(f, 1), testKey(f, 2), testKey(f, 3)
	msg := func(k vpnkey.Pair, auth, node string) []byte {
		_, m, err := startHandshake(&k, hub.Public, auth, node, newDetRand(9))
		if err != nil {
			f.Fatal(err)
		}
		return m
	}
	valid := ipv4Packet(addrA, addrB, []byte("payload"))
	seeds := map[string][][][]byte{
		"FuzzHandshakeMessage": {
			{frame(msg(cli, testAuthority, "node-a"))}, {frame(msg(cli, testAuthority, "node-b"))},
			{frame(msg(other, testAuthority, "node-a"))}, {frame(msg(cli, "authority-2", "node-a"))},
			{frame(nil)}, {{0xff, 0xff, 1}}, {frame(bytes.Repeat([]byte{0}, 96))},
		},
		"FuzzHandshakePayload": {
			{[]byte(`{"nodeId":"node-a","timestamp":1764561600123456}`), []byte(`{"controlAddress":"10.64.0.2","mtu":1216,"expiresAt":1700000060000}`)},
			{[]byte(`{"timestamp":0,"nodeId":"node-a","v":2}`), []byte(`{"expiresAt":1,"controlAddress":"10.64.0.2","mtu":1216,"x":null}`)},
			{[]byte(`{"nodeId":"node-b"}`), []byte(`{"controlAddress":"10.64.0.2","mtu":67,"expiresAt":1}`)},
			{[]byte(`{"nodeId":"node-a","nodeId":"node-a"}`), []byte(`{"controlAddress":"::1","mtu":1216,"expiresAt":1}`)},
			{[]byte(`{}`), []byte(`{"controlAddress":"10.64.0.2","mtu":1216}`)},
		},
		"FuzzDatagram": {
			{nil, valid, be64(1)}, {bytes.Repeat([]byte{1}, 40), ipv4Packet(addrB, addrB, nil), be64(7)},
			{be64(3), ipv4Packet(addrA, netip.MustParseAddr("224.0.0.1"), nil), be64(1<<64 - 1)}, {nil, valid[:20], be64(0)},
		},
	}
	if os.Getenv("VPNHUB_WRITE_SEEDS") != "" {
		for name, list := range seeds {
			dir := filepath.Join("testdata", "fuzz", name)
			os.MkdirAll(dir, 0o755)
			for i, args := range list {
				var b bytes.Buffer
				b.WriteString("go test fuzz v1\n")
				for j, a := range args {
					if name == "FuzzDatagram" && j == 2 {
						fmt.Fprintf(&b, "uint64(%d)\n", binary.BigEndian.Uint64(a))
						continue
					}
					fmt.Fprintf(&b, "[]byte(%q)\n", a)
				}
				os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), b.Bytes(), 0o644)
			}
		}
	}
	return seeds
}
