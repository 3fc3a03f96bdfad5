package vpnhub

import (
	"crypto/cipher"
	"encoding/binary"
	"math"

	"golang.org/x/crypto/chacha20poly1305"

	"code.foss.global/serve.zone/relay/contracts"
)

// Data datagrams (SPEC §7): an 8-byte big-endian counter, then ChaCha20-Poly1305 of the packet
// under one direction's Noise transport key, nonce = 4 zero bytes ‖ counter little-endian (Noise's
// ChaChaPoly nonce), no associated data. Sealer and opener hold their own nonce buffer, so sealing
// and opening allocate nothing (flynn/noise's CipherState.Encrypt lets its nonce escape).

// sealer seals one direction's datagrams. It is owned by one goroutine.
type sealer struct {
	aead    cipher.AEAD
	counter uint64 // the last counter used; the next datagram gets counter+1
	nonce   [chacha20poly1305.NonceSize]byte
	buf     []byte // the datagram being built, reused
}

func newSealer(key [32]byte, maxPacket int) *sealer {
	aead, err := chacha20poly1305.New(key[:])
	if err != nil {
		panic(err) // only a key of the wrong length fails, and the key is 32 bytes
	}
	return &sealer{aead: aead, buf: make([]byte, 0, maxPacket+contracts.VPNDataOverhead)}
}

// seal returns the datagram for packet, valid until the next call. ok is false once the counter
// space is spent; the session must end then.
func (s *sealer) seal(packet []byte) (datagram []byte, ok bool) {
	if s.counter >= math.MaxUint64-1 {
		return nil, false
	}
	s.counter++
	need := contracts.VPNDataOverhead + len(packet)
	if cap(s.buf) < need {
		s.buf = make([]byte, 0, need)
	}
	d := s.buf[:contracts.VPNCounterBytes]
	binary.BigEndian.PutUint64(d, s.counter)
	binary.LittleEndian.PutUint64(s.nonce[4:], s.counter)
	return s.aead.Seal(d, s.nonce[:], packet, nil), true
}

// opener opens one direction's datagrams and keeps its replay window. It is owned by one
// goroutine.
type opener struct {
	aead   cipher.AEAD
	window replayWindow
	nonce  [chacha20poly1305.NonceSize]byte
}

func newOpener(key [32]byte) *opener {
	aead, err := chacha20poly1305.New(key[:])
	if err != nil {
		panic(err)
	}
	return &opener{aead: aead}
}

// open authenticates and decrypts datagram in place and returns the inner packet, a sub-slice of
// datagram. A datagram that is too short, replayed or does not authenticate gives a drop reason.
func (o *opener) open(datagram []byte) ([]byte, dropReason) {
	if len(datagram) < contracts.VPNDataOverhead {
		return nil, dropMalformed
	}
	counter := binary.BigEndian.Uint64(datagram)
	if !o.window.check(counter) {
		return nil, dropReplayed
	}
	binary.LittleEndian.PutUint64(o.nonce[4:], counter)
	body := datagram[contracts.VPNCounterBytes:]
	packet, err := o.aead.Open(body[:0], o.nonce[:], body, nil)
	if err != nil {
		return nil, dropUnauthenticated
	}
	o.window.accept(counter)
	return packet, dropNone
}
