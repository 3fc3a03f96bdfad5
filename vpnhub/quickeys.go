package vpnhub

import (
	"crypto/hkdf"
	"crypto/sha256"

	"github.com/quic-go/quic-go"

	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// The QUIC keys every replica of a cluster's hub shares (project-defined). quic-go answers a
// packet of a connection it does not know with a stateless reset only when it has a reset key,
// and the client believes the reset only when its token is the one the connection's server
// derived from that key. Replicas that hold the same hub key (one Secret) derive the same reset
// key, so a member's connection to a leader that crashed is reset by the new leader as soon as
// its packets arrive there, and the member redials at once instead of waiting out its idle
// timeout. The token key (address-validation tokens) is shared for the same reason: a token one
// replica issued validates at another.
const (
	resetKeyInfo = "serve.zone/relay-hub-reset"
	tokenKeyInfo = "serve.zone/relay-hub-token"
)

// quicKeys derives the hub's QUIC stateless-reset key and token key from its static private key:
// HKDF-SHA256 (RFC 5869) with no salt and the info strings above, 32 bytes each. The private key
// never leaves this function but as the two derived keys, which reveal nothing of it.
func quicKeys(k *vpnkey.Pair) (reset quic.StatelessResetKey, token quic.TokenGeneratorKey) {
	priv := k.Private()
	r, err := hkdf.Key(sha256.New, priv[:], nil, resetKeyInfo, len(reset))
	if err != nil {
		panic("vpnhub: hkdf: " + err.Error()) // only for a length past 255·32 bytes
	}
	t, err := hkdf.Key(sha256.New, priv[:], nil, tokenKeyInfo, len(token))
	if err != nil {
		panic("vpnhub: hkdf: " + err.Error())
	}
	copy(reset[:], r)
	copy(token[:], t)
	clear(priv[:])
	return reset, token
}
