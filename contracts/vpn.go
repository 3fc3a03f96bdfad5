package contracts

import (
	"net/netip"
	"strconv"
	"time"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// The managed VPN hub's wire (docs/protocol.md#vpn-hub). Everything in this file is project-defined unless marked
// seed-defined: the seeds state only that nodes dial a hub over QUIC with a Noise server key, a
// client key pair, a managed authority id and an expiry, and that control addresses come from
// vpn.controlPrefix. A node implementation written from docs/protocol.md#vpn-hub must interoperate with these
// constants and readers.
//
// # Protocol flow
//
//  1. Cloudly pushes pushClusterVpnMembership { authorityId, controlPrefix, generation, members }
//     (ReadVPNMembershipPush); the hub answers { appliedGeneration } (EncodeVPNMembershipApplied).
//  2. A node dials the hub over QUIC v1 with DATAGRAM (RFC 9221), ALPN VPNHubALPN, without
//     verifying the hub's self-signed certificate.
//  3. On the first bidirectional stream, each message prefixed by a 2-byte big-endian length
//     (VPNHandshakeLengthBytes), the node sends Noise IK message 1 (VPNNoiseProtocol, prologue
//     VPNHubPrologue(authorityId)) with payload { nodeId, timestamp } (EncodeVPNHello), timestamp
//     the node's Unix time in microseconds; the hub refuses a timestamp not greater than the last
//     it accepted for the key (vpn-handshake-replayed), answers message 2 with payload
//     { controlAddress, mtu, expiresAt } (EncodeVPNWelcome), or closes the connection with
//     application error VPNCloseCodeRefused and a reason that starts with one of VPNRefusals.
//     The stream stays open for the life of the session.
//  4. Each QUIC datagram is one IP packet: an 8-byte big-endian counter (from 1), then the
//     ChaCha20-Poly1305 sealing of the packet under that direction's Noise transport key, nonce =
//     4 zero bytes ‖ counter little-endian, no associated data (VPNDataOverhead bytes in all).
//     An empty packet is a keep-alive: the node sends one right after the handshake and every
//     VPNKeepAliveInterval while idle; a session with no authenticated datagram within
//     VPNSilentTimeout of its handshake is closed (vpn-session-silent).
//  5. Refusal reasons travel in unauthenticated QUIC close frames, so a node redials with backoff
//     after every refusal, vpn-member-replaced included, and never stops for one.

// Project-defined protocol constants of the VPN hub.
const (
	// VPNHubALPN is the QUIC ALPN a hub serves and a node offers.
	VPNHubALPN = "servezone-vpnhub"
	// VPNNoiseProtocol is the Noise protocol name of the handshake.
	VPNNoiseProtocol = "Noise_IK_25519_ChaChaPoly_BLAKE2s"
	// VPNHandshakeLengthBytes is the big-endian length prefix of each handshake message.
	VPNHandshakeLengthBytes = 2
	// VPNMaxHandshakeMessage is the largest handshake message the prefix can state (Noise's own
	// limit too).
	VPNMaxHandshakeMessage = 65535
	// VPNCloseCodeRefused is the QUIC application error code of a refusal or removal; the reason
	// phrase starts with a VPNRefusals name.
	VPNCloseCodeRefused = 1
	// VPNCloseCodeNone is the application error code of an ordinary close: hub shutdown, a node
	// leaving, a handshake that timed out or broke off. Its reason names no refusal.
	VPNCloseCodeNone = 0
	// VPNCounterBytes, VPNTagBytes and VPNDataOverhead describe a data datagram: the counter, the
	// AEAD tag, and both together (the datagram payload less the inner packet).
	VPNCounterBytes = 8
	VPNTagBytes     = 16
	VPNDataOverhead = VPNCounterBytes + VPNTagBytes
	// VPNMinMTU and VPNMaxMTU bound message 2's mtu: IPv4's minimum datagram size, and the
	// largest IP packet.
	VPNMinMTU = 68
	VPNMaxMTU = 65535
	// VPNMaxMembers bounds a membership push's member list.
	VPNMaxMembers = 65536
	// VPNMaxControlPrefixLength is seed-defined:
	// runtimeNetworkAddressPlanContract.maximumControlPrefixLength.
	VPNMaxControlPrefixLength = 30
	// VPNKeepAliveInterval is how long a node's session may be idle before it sends an empty
	// keep-alive datagram.
	VPNKeepAliveInterval = 10 * time.Second
	// VPNSilentTimeout is how long after its handshake a session may go without an authenticated
	// datagram before the hub closes it (vpn-session-silent).
	VPNSilentTimeout = 15 * time.Second
)

// VPNHubPrologue is the Noise prologue: "servezone-vpnhub:" followed by the authority id.
func VPNHubPrologue(authorityID string) []byte {
	return append([]byte(VPNHubALPN+":"), authorityID...)
}

// VPNMember is one member of a membership push.
type VPNMember struct {
	NodeID         string
	PublicKey      [32]byte
	ControlAddress netip.Addr
	ExpiresAt      int64 // Unix ms; the member is valid while now < ExpiresAt
}

// VPNMembership is pushClusterVpnMembership's request.
type VPNMembership struct {
	AuthorityID   string
	ControlPrefix netip.Prefix
	Generation    int64
	Members       []VPNMember
}

var privateIPv4 = [...]netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
}

// ReadVPNControlPrefix is runtimeNetworkVpnControlPrefix: a canonical IPv4 prefix text
// ("10.64.0.0/16": dotted quad without leading zeros, no host bits) inside one of the private
// ranges 10/8, 172.16/12, 192.168/16, no longer than /30. The private-range rule keeps it at /8 or
// longer.
func ReadVPNControlPrefix(s string) (netip.Prefix, bool) {
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() || p.Masked() != p || p.String() != s || p.Bits() > VPNMaxControlPrefixLength {
		return netip.Prefix{}, false
	}
	for _, r := range privateIPv4 {
		if r.Bits() <= p.Bits() && r.Contains(p.Addr()) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// IsVPNControlAddress reports whether a is a usable control address of prefix: inside it, and
// neither its network nor its broadcast address.
func IsVPNControlAddress(prefix netip.Prefix, a netip.Addr) bool {
	if !a.Is4() || !prefix.Contains(a) || a == prefix.Addr() {
		return false
	}
	b := prefix.Addr().As4()
	host := uint32(1)<<(32-prefix.Bits()) - 1
	v := (uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])) | host
	return a != netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// readIPv4 reads a canonical dotted-quad IPv4 literal.
func readIPv4(raw []byte) (netip.Addr, bool) {
	s, err := strictjson.ReadString(raw)
	if err != nil {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() || a.String() != s {
		return netip.Addr{}, false
	}
	return a, true
}

// ReadVPNMembershipPush reads pushClusterVpnMembership's request tolerantly (the push is
// project-defined): its four members and each member's four are required, every other member at
// either level is ignored. authorityId is a canonical identifier; controlPrefix per
// ReadVPNControlPrefix; generation a non-negative safe integer; at most VPNMaxMembers members,
// each { nodeId, publicKey, controlAddress, expiresAt } with a cluster node id, a 32-byte key in
// base64url without padding, a control address inside the prefix (not its network or broadcast
// address) and a non-negative safe integer (Unix ms); node ids, keys and control addresses each
// unique. A violation is an *InvalidError, one reason each.
func ReadVPNMembershipPush(raw []byte) (VPNMembership, error) {
	const path = "vpn membership"
	var authorityID, controlPrefix, generation, membersRaw []byte
	if strictjson.ReadTolerant(raw, strictjson.Req("authorityId", &authorityID), strictjson.Req("controlPrefix", &controlPrefix),
		strictjson.Req("generation", &generation), strictjson.Req("members", &membersRaw)) != nil {
		return VPNMembership{}, &InvalidError{[]string{path + " must be an object carrying authorityId, controlPrefix, generation and members"}}
	}
	var out VPNMembership
	var reasons []string
	if s, err := strictjson.ReadString(authorityID); err != nil || !IsCanonicalID(s) {
		reasons = append(reasons, path+" authorityId must be a canonical identifier")
	} else {
		out.AuthorityID = s
	}
	prefixOK := false
	if s, err := strictjson.ReadString(controlPrefix); err == nil {
		out.ControlPrefix, prefixOK = ReadVPNControlPrefix(s)
	}
	if !prefixOK {
		reasons = append(reasons, path+" controlPrefix must be a private IPv4 prefix no longer than /30")
	}
	if g, ok := strictjson.ReadCounter(generation); !ok {
		reasons = append(reasons, path+" generation must be a non-negative safe integer")
	} else {
		out.Generation = g
	}
	elems, err := strictjson.ReadArray(membersRaw)
	if err != nil || len(elems) > VPNMaxMembers {
		reasons = append(reasons, path+" members must be an array of at most 65536 entries")
		elems = nil
	}
	nodes := make(map[string]bool, len(elems))
	keys := make(map[[32]byte]bool, len(elems))
	addrs := make(map[netip.Addr]bool, len(elems))
	out.Members = make([]VPNMember, 0, len(elems))
	for i, e := range elems {
		p := path + " members[" + strconv.Itoa(i) + "]"
		var nodeID, publicKey, controlAddress, expiresAt []byte
		if strictjson.ReadTolerant(e, strictjson.Req("nodeId", &nodeID), strictjson.Req("publicKey", &publicKey), strictjson.Req("controlAddress", &controlAddress),
			strictjson.Req("expiresAt", &expiresAt)) != nil {
			reasons = append(reasons, p+" must be an object carrying nodeId, publicKey, controlAddress and expiresAt")
			continue
		}
		var mem VPNMember
		bad := len(reasons)
		if s, err := strictjson.ReadString(nodeID); err != nil || !IsClusterNodeID(s) {
			reasons = append(reasons, p+" nodeId must be a cluster node id")
		} else if nodes[s] {
			reasons = append(reasons, p+" nodeId must be unique")
		} else {
			mem.NodeID = s
		}
		if s, err := strictjson.ReadString(publicKey); err != nil {
			reasons = append(reasons, p+" publicKey must be a 32-byte key in base64url without padding")
		} else if k, err := DecodeKey32(s); err != nil {
			reasons = append(reasons, p+" publicKey must be a 32-byte key in base64url without padding")
		} else if keys[k] {
			reasons = append(reasons, p+" publicKey must be unique")
		} else {
			mem.PublicKey = k
		}
		if a, ok := readIPv4(controlAddress); !ok || (prefixOK && !IsVPNControlAddress(out.ControlPrefix, a)) {
			reasons = append(reasons, p+" controlAddress must be an IPv4 host address inside controlPrefix")
		} else if addrs[a] {
			reasons = append(reasons, p+" controlAddress must be unique")
		} else {
			mem.ControlAddress = a
		}
		if t, ok := strictjson.ReadCounter(expiresAt); !ok {
			reasons = append(reasons, p+" expiresAt must be a non-negative safe integer (Unix ms)")
		} else {
			mem.ExpiresAt = t
		}
		if len(reasons) == bad {
			nodes[mem.NodeID], keys[mem.PublicKey], addrs[mem.ControlAddress] = true, true, true
			out.Members = append(out.Members, mem)
		}
	}
	if len(reasons) > 0 {
		return VPNMembership{}, &InvalidError{reasons}
	}
	return out, nil
}

// EncodeVPNMembershipPush encodes m as pushClusterVpnMembership's request, keys in the order
// docs/protocol.md#vpn-hub lists them.
func EncodeVPNMembershipPush(m VPNMembership) []byte {
	b := strictjson.AppendString([]byte(`{"authorityId":`), m.AuthorityID)
	b = append(b, `,"controlPrefix":`...)
	b = strictjson.AppendString(b, m.ControlPrefix.String())
	b = append(b, `,"generation":`...)
	b = strconv.AppendInt(b, m.Generation, 10)
	b = append(b, `,"members":[`...)
	for i, mem := range m.Members {
		if i > 0 {
			b = append(b, ',')
		}
		b = strictjson.AppendString(append(b, `{"nodeId":`...), mem.NodeID)
		b = strictjson.AppendString(append(b, `,"publicKey":`...), EncodeKey32(mem.PublicKey))
		b = strictjson.AppendString(append(b, `,"controlAddress":`...), mem.ControlAddress.String())
		b = strconv.AppendInt(append(b, `,"expiresAt":`...), mem.ExpiresAt, 10)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// EncodeVPNMembershipApplied is the push's answer { appliedGeneration }: the generation the hub
// holds after the push (an older or equal push leaves the held one).
func EncodeVPNMembershipApplied(generation int64) []byte {
	return append(strconv.AppendInt([]byte(`{"appliedGeneration":`), generation, 10), '}')
}

// ReadVPNMembershipApplied reads the push's answer tolerantly (project-defined): its
// appliedGeneration; any other member is ignored.
func ReadVPNMembershipApplied(raw []byte) (int64, bool) {
	var generation []byte
	if strictjson.ReadTolerant(raw, strictjson.Req("appliedGeneration", &generation)) != nil {
		return 0, false
	}
	return strictjson.ReadCounter(generation)
}

// VPNHello is message 1's payload: the node the key claims to be, and the node's Unix time in
// microseconds when it wrote the message, which must grow from one handshake of a key to the
// next (WireGuard's TAI64N timestamp: a replayed message 1 carries an old one).
type VPNHello struct {
	NodeID    string
	Timestamp int64
}

// EncodeVPNHello encodes message 1's payload { nodeId, timestamp }.
func EncodeVPNHello(h VPNHello) []byte {
	b := strictjson.AppendString([]byte(`{"nodeId":`), h.NodeID)
	b = strconv.AppendInt(append(b, `,"timestamp":`...), h.Timestamp, 10)
	return append(b, '}')
}

// ReadVPNHello reads message 1's payload. The shape is project-defined, so it is read tolerantly
// (the reading rule of docs/protocol.md#sources-and-conventions): members other than nodeId and timestamp are ignored. nodeId must be a
// cluster node id and timestamp a non-negative safe integer.
func ReadVPNHello(raw []byte) (VPNHello, error) {
	var node, timestamp []byte
	if strictjson.ReadTolerant(raw, strictjson.Opt("nodeId", &node), strictjson.Opt("timestamp", &timestamp)) != nil {
		return VPNHello{}, &InvalidError{[]string{"vpn hello must be an object"}}
	}
	var h VPNHello
	var reasons []string
	if s, err := strictjson.ReadString(node); err != nil || !IsClusterNodeID(s) {
		reasons = append(reasons, "vpn hello nodeId must be a cluster node id")
	} else {
		h.NodeID = s
	}
	var ok bool
	if h.Timestamp, ok = strictjson.ReadCounter(timestamp); !ok {
		reasons = append(reasons, "vpn hello timestamp must be a non-negative safe integer (Unix µs)")
	}
	if len(reasons) > 0 {
		return VPNHello{}, &InvalidError{reasons}
	}
	return h, nil
}

// VPNWelcome is message 2's payload: the member's control address, the largest inner packet the
// hub's side of the connection carries, and the member's expiry (Unix ms).
type VPNWelcome struct {
	ControlAddress netip.Addr
	MTU            int
	ExpiresAt      int64
}

// EncodeVPNWelcome encodes message 2's payload { controlAddress, mtu, expiresAt }.
func EncodeVPNWelcome(w VPNWelcome) []byte {
	b := strictjson.AppendString([]byte(`{"controlAddress":`), w.ControlAddress.String())
	b = strconv.AppendInt(append(b, `,"mtu":`...), int64(w.MTU), 10)
	b = strconv.AppendInt(append(b, `,"expiresAt":`...), w.ExpiresAt, 10)
	return append(b, '}')
}

// ReadVPNWelcome reads message 2's payload, tolerantly as ReadVPNHello: a canonical IPv4 control
// address, an mtu from VPNMinMTU to VPNMaxMTU, and a non-negative safe integer expiry; other
// members are ignored.
func ReadVPNWelcome(raw []byte) (VPNWelcome, error) {
	const path = "vpn welcome"
	var controlAddress, mtu, expiresAt []byte
	if strictjson.ReadTolerant(raw, strictjson.Opt("controlAddress", &controlAddress), strictjson.Opt("mtu", &mtu), strictjson.Opt("expiresAt", &expiresAt)) != nil {
		return VPNWelcome{}, &InvalidError{[]string{path + " must be an object"}}
	}
	var w VPNWelcome
	var reasons []string
	if a, ok := readIPv4(controlAddress); !ok || !IsPlausibleUnicastIPv4(a.String()) {
		reasons = append(reasons, path+" controlAddress must be a unicast IPv4 literal")
	} else {
		w.ControlAddress = a
	}
	if n, ok := strictjson.ReadCounter(mtu); !ok || n < VPNMinMTU || n > VPNMaxMTU {
		reasons = append(reasons, path+" mtu must be an integer from 68 to 65535")
	} else {
		w.MTU = int(n)
	}
	var ok bool
	if w.ExpiresAt, ok = strictjson.ReadCounter(expiresAt); !ok {
		reasons = append(reasons, path+" expiresAt must be a non-negative safe integer (Unix ms)")
	}
	if len(reasons) > 0 {
		return VPNWelcome{}, &InvalidError{reasons}
	}
	return w, nil
}
