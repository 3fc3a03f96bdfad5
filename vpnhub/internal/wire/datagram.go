package wire

import (
	"crypto/cipher"
	"encoding/binary"
	"math"

	"golang.org/x/crypto/chacha20poly1305"

	"code.foss.global/serve.zone/relay/contracts"
)

// Data datagrams (docs/protocol.md#vpn-hub): an 8-byte big-endian counter, then ChaCha20-Poly1305 of the packet
// under one direction's Noise transport key, nonce = 4 zero bytes ‖ counter little-endian (Noise's
// ChaChaPoly nonce), no associated data. An empty packet is a keep-alive. Sealer and Opener hold
// their own nonce buffer, so sealing and opening allocate nothing (flynn/noise's
// CipherState.Encrypt lets its nonce escape).

// Sealer seals one direction's datagrams. It is owned by one goroutine.
type Sealer struct {
	aead    cipher.AEAD
	counter uint64 // the last counter used; the next datagram gets counter+1
	nonce   [chacha20poly1305.NonceSize]byte
	buf     []byte // the datagram being built, reused
}

// NewSealer seals under key; maxPacket sizes its reused buffer.
func NewSealer(key [32]byte, maxPacket int) *Sealer {
	aead, err := chacha20poly1305.New(key[:])
	if err != nil {
		panic(err) // only a key of the wrong length fails, and the key is 32 bytes
	}
	return &Sealer{aead: aead, buf: make([]byte, 0, maxPacket+contracts.VPNDataOverhead)}
}

// Seal returns the datagram for packet, valid until the next call. ok is false once the counter
// space is spent; the session must end then.
func (s *Sealer) Seal(packet []byte) (datagram []byte, ok bool) {
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

// SetCounter makes the next datagram carry counter+1 (tests and fuzzing reach the counter's end
// with it).
func (s *Sealer) SetCounter(counter uint64) { s.counter = counter }

// Verdict is what opening a datagram found.
type Verdict uint8

// Verdicts of Opener.Open.
const (
	Opened          Verdict = iota
	Malformed               // too short to be a datagram
	Replayed                // a counter already seen, or older than the window
	Unauthenticated         // the AEAD did not open it
)

// Opener opens one direction's datagrams and keeps its replay window. It is owned by one
// goroutine.
type Opener struct {
	aead   cipher.AEAD
	window ReplayWindow
	nonce  [chacha20poly1305.NonceSize]byte
}

// NewOpener opens under key.
func NewOpener(key [32]byte) *Opener {
	aead, err := chacha20poly1305.New(key[:])
	if err != nil {
		panic(err)
	}
	return &Opener{aead: aead}
}

// Open authenticates and decrypts datagram in place and returns the inner packet, a sub-slice of
// datagram (empty for a keep-alive).
func (o *Opener) Open(datagram []byte) ([]byte, Verdict) {
	return o.OpenTo(datagram[min(len(datagram), contracts.VPNCounterBytes):][:0], datagram)
}

// OpenTo is Open with the packet written to dst's spare capacity instead of in place: dst must
// not overlap datagram, or start exactly at its ciphertext.
func (o *Opener) OpenTo(dst, datagram []byte) ([]byte, Verdict) {
	if len(datagram) < contracts.VPNDataOverhead {
		return nil, Malformed
	}
	counter := binary.BigEndian.Uint64(datagram)
	if !o.window.Check(counter) {
		return nil, Replayed
	}
	binary.LittleEndian.PutUint64(o.nonce[4:], counter)
	packet, err := o.aead.Open(dst, o.nonce[:], datagram[contracts.VPNCounterBytes:], nil)
	if err != nil {
		return nil, Unauthenticated
	}
	o.window.Accept(counter)
	return packet, Opened
}
