// Package vpntest holds what the tests of the VPN hub and of its client share: keys, members,
// inner packets, polling and a leak check. It is imported by tests only, and imports neither the
// hub nor the client, so that both may use it.
package vpntest

import (
	"encoding/binary"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// Authority is the authority id of the tests' memberships; Now their Unix ms "now", from which
// members expire 60 s later.
const (
	Authority = "authority-1"
	Now       = int64(1_700_000_000_000)
)

// ControlPrefix is the tests' control prefix; A and B the control addresses of Member(…, 2) and
// Member(…, 3).
var (
	ControlPrefix = netip.MustParsePrefix("10.64.0.0/24")
	A             = netip.MustParseAddr("10.64.0.2")
	B             = netip.MustParseAddr("10.64.0.3")
)

// Key is a fixed key pair, one per b.
func Key(t testing.TB, b byte) vpnkey.Pair {
	t.Helper()
	k, err := vpnkey.FromPrivate([32]byte{b, 0x42, b, 7})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Member is node with key k at control address 10.64.0.last, expiring at Now + 60 s.
func Member(k vpnkey.Pair, node string, last byte) contracts.VPNMember {
	return contracts.VPNMember{NodeID: node, PublicKey: k.Public, ControlAddress: netip.AddrFrom4([4]byte{10, 64, 0, last}),
		ExpiresAt: Now + 60_000}
}

// Membership is a push of members under Authority and ControlPrefix.
func Membership(generation int64, members ...contracts.VPNMember) []byte {
	return contracts.EncodeVPNMembershipPush(contracts.VPNMembership{AuthorityID: Authority, ControlPrefix: ControlPrefix,
		Generation: generation, Members: members})
}

// IPv4Packet builds an IPv4/UDP packet from src to dst carrying payload, checksums included.
func IPv4Packet(src, dst netip.Addr, payload []byte) []byte {
	p := make([]byte, 28+len(payload))
	p[0], p[8], p[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	s, d := src.As4(), dst.As4()
	copy(p[12:16], s[:])
	copy(p[16:20], d[:])
	binary.BigEndian.PutUint16(p[10:], Checksum(p[:20]))
	binary.BigEndian.PutUint16(p[20:], 4000)
	binary.BigEndian.PutUint16(p[22:], 5000)
	binary.BigEndian.PutUint16(p[24:], uint16(8+len(payload)))
	copy(p[28:], payload)
	return p
}

// Checksum is the Internet checksum of b, the slow way.
func Checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// Eventually polls cond until it holds or 10 s pass.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // the poll: the VPN tests' states announce themselves to no one
	}
}

// CheckLeaks fails the test if goroutines it started outlive it. Call it first: cleanups run
// last-in first-out, so the check runs after every other cleanup stopped hubs and clients.
func CheckLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// Logger logs to the test's output when VPNHUB_TEST_LOG is set.
func Logger(t testing.TB) zerolog.Logger {
	if os.Getenv("VPNHUB_TEST_LOG") == "" {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
}
