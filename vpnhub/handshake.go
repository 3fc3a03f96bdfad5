package vpnhub

import (
	"fmt"
	"io"

	"github.com/flynn/noise"

	"code.foss.global/serve.zone/relay/contracts"
)

// The Noise IK handshake of SPEC §7 as two plain state machines with no I/O of their own: the
// hub's responder takes message 1 and answers message 2 or a named refusal; the client's
// initiator writes message 1 and reads message 2. Callers move the bytes (framing.go) and own
// time: the responder is handed "now" and the membership view it judges against.
//
// The responder judges in a fixed order: a membership is held (else vpn-member-unknown); message
// 1 opens under the hub's static key and the prologue of the held authority (else
// vpn-authority-mismatch: a client with another authority id or another hub key cannot be told
// apart from garbage); the client's static key is a member (vpn-member-unknown); the payload
// names that member's node (vpn-member-node-mismatch); the member has not expired
// (vpn-member-expired).

// maxHandshakeMessage bounds the messages either side reads: message 1 is 96 bytes plus a payload
// of at most ~150.
const maxHandshakeMessage = 1024

var noiseSuite = noise.NewCipherSuite(noise.DH25519, noise.CipherChaChaPoly, noise.HashBLAKE2s)

// noiseProtocolName is the protocol name flynn/noise mixes into the handshake; a test pins it to
// contracts.VPNNoiseProtocol.
func noiseProtocolName() string {
	return "Noise_" + noise.HandshakeIK.Name + "_" + string(noiseSuite.Name())
}

// transportKeys are one session's two Noise transport keys as seen by one side.
type transportKeys struct {
	send, recv [32]byte
}

// accepted is a handshake the responder accepted.
type accepted struct {
	msg2      []byte
	keys      transportKeys
	member    contracts.VPNMember
	authority string // the authority of the view the handshake was judged against
}

// respond is the hub's side: it reads message 1 against view at nowMs (Unix ms) and answers
// message 2 announcing mtu, or a refusal. rng supplies the ephemeral key (nil: crypto/rand).
func respond(hubKey *StaticKey, view *membershipView, msg1 []byte, nowMs int64, mtu int, rng io.Reader) (accepted, *contracts.Refusal) {
	if view == nil {
		return accepted{}, contracts.VPNMemberUnknown.Refuse("the hub holds no membership yet")
	}
	priv := hubKey.Private()
	hs, err := noise.NewHandshakeState(noise.Config{
		CipherSuite: noiseSuite, Random: rng, Pattern: noise.HandshakeIK, Initiator: false,
		Prologue:      view.prologue,
		StaticKeypair: noise.DHKey{Private: priv[:], Public: hubKey.Public[:]},
	})
	if err != nil {
		return accepted{}, contracts.VPNAuthorityMismatch.Refuse("handshake state: %v", err)
	}
	payload, _, _, err := hs.ReadMessage(nil, msg1)
	if err != nil {
		return accepted{}, contracts.VPNAuthorityMismatch.Refuse(
			"message 1 does not open under this hub's key and authority %s", view.authorityID)
	}
	var peer [32]byte
	copy(peer[:], hs.PeerStatic())
	member, ok := view.byKey[peer]
	if !ok {
		return accepted{}, contracts.VPNMemberUnknown.Refuse("key %s is not a member of generation %d",
			contracts.ShortKey(peer), view.generation)
	}
	nodeID, err := contracts.ReadVPNHello(payload)
	switch {
	case err != nil:
		return accepted{}, contracts.VPNMemberNodeMismatch.Refuse("key %s belongs to node %s; message 1 names no node (%v)",
			contracts.ShortKey(peer), member.NodeID, err)
	case nodeID != member.NodeID:
		return accepted{}, contracts.VPNMemberNodeMismatch.Refuse("key %s belongs to node %s, not %s",
			contracts.ShortKey(peer), member.NodeID, nodeID)
	case nowMs >= member.ExpiresAt:
		return accepted{}, contracts.VPNMemberExpired.Refuse("node %s expired at %d", member.NodeID, member.ExpiresAt)
	}
	welcome := contracts.EncodeVPNWelcome(contracts.VPNWelcome{
		ControlAddress: member.ControlAddress, MTU: mtu, ExpiresAt: member.ExpiresAt,
	})
	msg2, recv, send, err := hs.WriteMessage(nil, welcome)
	if err != nil || recv == nil || send == nil {
		return accepted{}, contracts.VPNAuthorityMismatch.Refuse("message 2: %v", err)
	}
	return accepted{msg2: msg2, keys: transportKeys{send: send.UnsafeKey(), recv: recv.UnsafeKey()}, member: member,
		authority: view.authorityID}, nil
}

// initiator is the client's side of one handshake.
type initiator struct {
	hs *noise.HandshakeState
}

// startHandshake writes message 1 for nodeID with the client's static key, to the hub key under
// the authority's prologue.
func startHandshake(key *StaticKey, hubKey [32]byte, authorityID, nodeID string, rng io.Reader) (*initiator, []byte, error) {
	priv := key.Private()
	hs, err := noise.NewHandshakeState(noise.Config{
		CipherSuite: noiseSuite, Random: rng, Pattern: noise.HandshakeIK, Initiator: true,
		Prologue:      contracts.VPNHubPrologue(authorityID),
		StaticKeypair: noise.DHKey{Private: priv[:], Public: key.Public[:]},
		PeerStatic:    hubKey[:],
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrHandshake, err)
	}
	msg1, _, _, err := hs.WriteMessage(nil, contracts.EncodeVPNHello(nodeID))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: message 1: %v", ErrHandshake, err)
	}
	return &initiator{hs: hs}, msg1, nil
}

// finish reads message 2: the hub's welcome and the session's transport keys.
func (i *initiator) finish(msg2 []byte) (contracts.VPNWelcome, transportKeys, error) {
	payload, send, recv, err := i.hs.ReadMessage(nil, msg2)
	if err != nil || send == nil || recv == nil {
		return contracts.VPNWelcome{}, transportKeys{}, fmt.Errorf("%w: message 2 does not open", ErrHandshake)
	}
	w, err := contracts.ReadVPNWelcome(payload)
	if err != nil {
		return contracts.VPNWelcome{}, transportKeys{}, fmt.Errorf("%w: %v", ErrHandshake, err)
	}
	return w, transportKeys{send: send.UnsafeKey(), recv: recv.UnsafeKey()}, nil
}
