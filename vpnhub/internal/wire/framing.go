package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"code.foss.global/serve.zone/relay/contracts"
)

// Handshake message framing on the first bidirectional stream: a 2-byte big-endian length, then
// the Noise message.

// MaxHandshakeMessage bounds the messages either side reads: message 1 is 96 bytes plus a payload
// of about 100, message 2 48 plus about 80.
const MaxHandshakeMessage = 1024

var errEmptyFrame = errors.New("handshake message of length 0")

// WriteFrame writes msg with its length prefix in one Write.
func WriteFrame(w io.Writer, msg []byte) error {
	if len(msg) > contracts.VPNMaxHandshakeMessage {
		return fmt.Errorf("handshake message of %d bytes is too long", len(msg))
	}
	b := make([]byte, contracts.VPNHandshakeLengthBytes+len(msg))
	binary.BigEndian.PutUint16(b, uint16(len(msg)))
	copy(b[contracts.VPNHandshakeLengthBytes:], msg)
	_, err := w.Write(b)
	return err
}

// ReadFrame reads one length-prefixed message of at most limit bytes. A longer or empty message is
// an error, read no further.
func ReadFrame(r io.Reader, limit int) ([]byte, error) {
	var l [contracts.VPNHandshakeLengthBytes]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(l[:]))
	switch {
	case n == 0:
		return nil, errEmptyFrame
	case n > limit:
		return nil, fmt.Errorf("handshake message of %d bytes exceeds %d", n, limit)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return msg, nil
}
