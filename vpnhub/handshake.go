package vpnhub

import (
	"io"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub/internal/wire"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// The hub's judgement of a message 1, a plain function with no I/O: it is handed the membership
// view and "now", and answers message 2 or a named refusal. The Noise cryptography is in
// internal/wire; the one judgement that needs state the view does not hold, whether the hello's
// timestamp is newer than the key's last (vpn-handshake-replayed), is made by Hub.register under
// the hub's lock.
//
// The order is fixed: a membership is held (else vpn-member-unknown); message 1 opens under the
// hub's static key and the prologue of the held authority (else vpn-authority-mismatch: a client
// with another authority id or another hub key cannot be told apart from garbage); the client's
// static key is a member (vpn-member-unknown); the payload names that member's node and carries a
// timestamp (vpn-member-node-mismatch); the member has not expired (vpn-member-expired).

// accepted is a handshake the responder accepted.
type accepted struct {
	msg2      []byte
	keys      wire.TransportKeys
	member    contracts.VPNMember
	authority string // the authority of the view the handshake was judged against
	timestamp int64  // the hello's, Unix µs
}

// respond reads message 1 against view at nowMs (Unix ms) and answers message 2 announcing mtu,
// or a refusal. rng supplies the ephemeral key (nil: crypto/rand).
func respond(hubKey *vpnkey.Pair, view *membershipView, msg1 []byte, nowMs int64, mtu int, rng io.Reader) (accepted, *contracts.Refusal) {
	if view == nil {
		return accepted{}, contracts.VPNMemberUnknown.Refuse("the hub holds no membership yet")
	}
	res, peer, payload, err := wire.ReadMessage1(hubKey, view.prologue, msg1, rng)
	if err != nil {
		return accepted{}, contracts.VPNAuthorityMismatch.Refuse(
			"message 1 does not open under this hub's key and authority %s", view.authorityID)
	}
	member, ok := view.byKey[peer]
	if !ok {
		return accepted{}, contracts.VPNMemberUnknown.Refuse("key %s is not a member of generation %d",
			contracts.ShortKey(peer), view.generation)
	}
	hello, err := contracts.ReadVPNHello(payload)
	switch {
	case err != nil:
		return accepted{}, contracts.VPNMemberNodeMismatch.Refuse("key %s belongs to node %s; message 1 is not { nodeId, timestamp } (%v)",
			contracts.ShortKey(peer), member.NodeID, err)
	case hello.NodeID != member.NodeID:
		return accepted{}, contracts.VPNMemberNodeMismatch.Refuse("key %s belongs to node %s, not %s",
			contracts.ShortKey(peer), member.NodeID, hello.NodeID)
	case nowMs >= member.ExpiresAt:
		return accepted{}, contracts.VPNMemberExpired.Refuse("node %s expired at %d", member.NodeID, member.ExpiresAt)
	}
	msg2, keys, err := res.WriteMessage2(contracts.EncodeVPNWelcome(contracts.VPNWelcome{
		ControlAddress: member.ControlAddress, MTU: mtu, ExpiresAt: member.ExpiresAt,
	}))
	if err != nil {
		return accepted{}, contracts.VPNAuthorityMismatch.Refuse("%v", err)
	}
	return accepted{msg2: msg2, keys: keys, member: member, authority: view.authorityID, timestamp: hello.Timestamp}, nil
}
