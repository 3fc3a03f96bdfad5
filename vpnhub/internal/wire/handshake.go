package wire

import (
	"errors"
	"fmt"
	"io"

	"github.com/flynn/noise"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// The two halves of docs/protocol.md#vpn-hub's Noise IK handshake, with no I/O of their own: callers move the bytes
// (framing.go) and judge the payloads. The hub's judgement of message 1 lives in the hub
// (vpnhub/handshake.go); here is only the cryptography both sides must agree on.

// Suite is Noise_IK_25519_ChaChaPoly_BLAKE2s's cipher suite.
var Suite = noise.NewCipherSuite(noise.DH25519, noise.CipherChaChaPoly, noise.HashBLAKE2s)

// ProtocolName is the protocol name flynn/noise mixes into the handshake; a test pins it to
// contracts.VPNNoiseProtocol.
func ProtocolName() string {
	return "Noise_" + noise.HandshakeIK.Name + "_" + string(Suite.Name())
}

// ErrHandshake is a handshake that broke off: a message that does not open, or a payload that
// breaks docs/protocol.md#vpn-hub.
var ErrHandshake = errors.New("vpnhub: handshake failed")

// TransportKeys are one session's two Noise transport keys as seen by one side.
type TransportKeys struct {
	Send, Recv [32]byte
}

// Initiator is the client's side of one handshake.
type Initiator struct {
	hs *noise.HandshakeState
}

// StartHandshake writes message 1 carrying hello with the client's static key, to the hub key
// under the authority's prologue. rng supplies the ephemeral key (nil: crypto/rand).
func StartHandshake(key *vpnkey.Pair, hubKey [32]byte, authorityID string, hello contracts.VPNHello, rng io.Reader) (*Initiator, []byte, error) {
	priv := key.Private()
	hs, err := noise.NewHandshakeState(noise.Config{
		CipherSuite: Suite, Random: rng, Pattern: noise.HandshakeIK, Initiator: true,
		Prologue:      contracts.VPNHubPrologue(authorityID),
		StaticKeypair: noise.DHKey{Private: priv[:], Public: key.Public[:]},
		PeerStatic:    hubKey[:],
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrHandshake, err)
	}
	msg1, _, _, err := hs.WriteMessage(nil, contracts.EncodeVPNHello(hello))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: message 1: %v", ErrHandshake, err)
	}
	return &Initiator{hs: hs}, msg1, nil
}

// Finish reads message 2: the hub's welcome and the session's transport keys.
func (i *Initiator) Finish(msg2 []byte) (contracts.VPNWelcome, TransportKeys, error) {
	payload, send, recv, err := i.hs.ReadMessage(nil, msg2)
	if err != nil || send == nil || recv == nil {
		return contracts.VPNWelcome{}, TransportKeys{}, fmt.Errorf("%w: message 2 does not open", ErrHandshake)
	}
	w, err := contracts.ReadVPNWelcome(payload)
	if err != nil {
		return contracts.VPNWelcome{}, TransportKeys{}, fmt.Errorf("%w: %v", ErrHandshake, err)
	}
	return w, TransportKeys{Send: send.UnsafeKey(), Recv: recv.UnsafeKey()}, nil
}

// Responder is the hub's side of one handshake, between message 1 and message 2.
type Responder struct {
	hs *noise.HandshakeState
}

// ReadMessage1 opens message 1 with the hub's static key under prologue, and returns the
// client's static key and message 1's payload. An error means the message does not open: another
// hub key, another prologue (authority), or garbage, which Noise cannot tell apart.
func ReadMessage1(hubKey *vpnkey.Pair, prologue, msg1 []byte, rng io.Reader) (*Responder, [32]byte, []byte, error) {
	priv := hubKey.Private()
	hs, err := noise.NewHandshakeState(noise.Config{
		CipherSuite: Suite, Random: rng, Pattern: noise.HandshakeIK,
		Prologue: prologue, StaticKeypair: noise.DHKey{Private: priv[:], Public: hubKey.Public[:]},
	})
	if err != nil {
		return nil, [32]byte{}, nil, err
	}
	payload, _, _, err := hs.ReadMessage(nil, msg1)
	if err != nil {
		return nil, [32]byte{}, nil, err
	}
	var peer [32]byte
	copy(peer[:], hs.PeerStatic())
	return &Responder{hs: hs}, peer, payload, nil
}

// WriteMessage2 answers message 2 carrying payload, and returns the session's transport keys.
func (r *Responder) WriteMessage2(payload []byte) ([]byte, TransportKeys, error) {
	msg2, recv, send, err := r.hs.WriteMessage(nil, payload)
	if err != nil || recv == nil || send == nil {
		return nil, TransportKeys{}, fmt.Errorf("message 2: %v", err)
	}
	return msg2, TransportKeys{Send: send.UnsafeKey(), Recv: recv.UnsafeKey()}, nil
}
