package ha

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/flynn/noise"
)

// The replication channel (docs/ha.md): Noise NNpsk0_25519_ChaChaPoly_SHA256 over TCP, the standby
// the initiator. Both sides prove they hold the replicas' shared key, and every byte after the
// handshake is encrypted. A transport message is a 2-byte big-endian length and at most
// noise.MaxMsgLen bytes of ciphertext; a frame (one record) is a 4-byte length and its bytes,
// carried in as many transport messages as it takes, and bounded by maxFrame.

// Bounds of the channel.
const (
	maxFrame         = 1 << 20 // a leader's record: a run of 32 renewals is tens of KiB
	maxPeerFrame     = 1 << 10 // a standby's frame: its hello, or an acknowledgement
	handshakeTimeout = 5 * time.Second
	// writeTimeout bounds every write: a peer that stops reading ends its channel.
	writeTimeout = 10 * time.Second
	// The prologue names the channel's version: a relay speaking another (no hello, other keys)
	// fails the handshake rather than misreading the records.
	prologue = "servezone-relay-replication-v2"
	chunk    = noise.MaxMsgLen - 16 // plaintext per transport message, with the tag
)

var suite = noise.NewCipherSuite(noise.DH25519, noise.CipherChaChaPoly, noise.HashSHA256)

// errFrameTooLarge is a peer's frame past its bound: the channel is closed.
var errFrameTooLarge = errors.New("ha: replication frame larger than its bound")

// channel is one end of an established replication channel. Reads and writes each belong to one
// goroutine.
type channel struct {
	conn         net.Conn           // set at construction
	rd           *bufio.Reader      // set at construction: owned by the reader
	send         *noise.CipherState // set at construction: owned by the writer
	recv         *noise.CipherState // set at construction: owned by the reader
	writeTimeout time.Duration      // set at construction
	wbuf         []byte             // owned by the writer
	rbuf         []byte             // owned by the reader
}

// handshake runs NNpsk0 on conn under key; initiator is the standby's side. The caller bounds it
// with a deadline on conn.
func handshake(conn net.Conn, key []byte, initiator bool) (*channel, error) {
	hs, err := noise.NewHandshakeState(noise.Config{CipherSuite: suite, Pattern: noise.HandshakeNN, Initiator: initiator,
		Prologue: []byte(prologue), PresharedKey: key, PresharedKeyPlacement: 0})
	if err != nil {
		return nil, err
	}
	rd := bufio.NewReaderSize(conn, 64<<10)
	var cs1, cs2 *noise.CipherState
	if initiator {
		msg, _, _, err := hs.WriteMessage(nil, nil)
		if err != nil {
			return nil, err
		}
		if err := writeMessage(conn, msg); err != nil {
			return nil, err
		}
		in, err := readMessage(rd, nil)
		if err != nil {
			return nil, err
		}
		if _, cs1, cs2, err = hs.ReadMessage(nil, in); err != nil {
			return nil, fmt.Errorf("ha: replication handshake: %w", err)
		}
		return newChannel(conn, rd, cs1, cs2), nil
	}
	in, err := readMessage(rd, nil)
	if err != nil {
		return nil, err
	}
	if _, _, _, err := hs.ReadMessage(nil, in); err != nil {
		return nil, fmt.Errorf("ha: replication handshake: %w", err)
	}
	msg, cs1, cs2, err := hs.WriteMessage(nil, nil)
	if err != nil {
		return nil, err
	}
	if err := writeMessage(conn, msg); err != nil {
		return nil, err
	}
	return newChannel(conn, rd, cs2, cs1), nil
}

func newChannel(conn net.Conn, rd *bufio.Reader, send, recv *noise.CipherState) *channel {
	return &channel{conn: conn, rd: rd, send: send, recv: recv, writeTimeout: writeTimeout}
}

func writeMessage(w io.Writer, msg []byte) error {
	b := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(msg)), uint16(len(msg)))
	_, err := w.Write(append(b, msg...))
	return err
}

func readMessage(r io.Reader, buf []byte) ([]byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(h[:]))
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	_, err := io.ReadFull(r, buf)
	return buf, err
}

// writeFrame sends one frame, within the write timeout.
func (c *channel) writeFrame(frame []byte) error {
	if len(frame) > maxFrame {
		return errFrameTooLarge
	}
	c.conn.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	var h [4]byte
	binary.BigEndian.PutUint32(h[:], uint32(len(frame)))
	plain := append(h[:], frame...)
	for len(plain) > 0 {
		n := min(len(plain), chunk)
		out, err := c.send.Encrypt(c.wbuf[:0], nil, plain[:n])
		if err != nil {
			return err
		}
		c.wbuf = out
		if err := writeMessage(c.conn, out); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return fmt.Errorf("%w: %w", errStalled, err)
			}
			return err
		}
		plain = plain[n:]
	}
	return nil
}

// readFrame receives one frame of at most limit bytes.
func (c *channel) readFrame(limit int) ([]byte, error) {
	var frame []byte
	want := -1
	for want < 0 || len(frame) < want+4 {
		msg, err := readMessage(c.rd, c.rbuf)
		if err != nil {
			return nil, err
		}
		c.rbuf = msg
		plain, err := c.recv.Decrypt(msg[:0:0], nil, msg)
		if err != nil {
			return nil, fmt.Errorf("ha: replication frame: %w", err)
		}
		frame = append(frame, plain...)
		if want < 0 && len(frame) >= 4 {
			want = int(binary.BigEndian.Uint32(frame))
			if want > limit {
				return nil, errFrameTooLarge
			}
		}
	}
	if len(frame) != want+4 {
		return nil, errors.New("ha: replication frame runs past its length")
	}
	return frame[4:], nil
}
