package ha

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"

	"k8s.io/apimachinery/pkg/util/validation"
)

// What the replication channel carries, frame by frame, once the Noise handshake is done:
//
//	standby → leader, first:  { "pod": "<its Pod name>" }      (JSON; the leader sends nothing before)
//	leader → standby:         set | delete | synced | ping     (records, numbered 1, 2, … in order; ping is not)
//	standby → leader:         ack n                            (records 1…n applied; also its keepalive)
//
// A record frame is op (1 byte), key length (2 bytes, big-endian), key, value. An ack is op, a
// zero key length and n as 8 bytes, big-endian. Every frame of a peer is judged before it is used:
// readRecord, readAck and readHello are the decoders of peer bytes, each fuzzed.

// Operations in a frame.
const (
	opSet    = 1
	opDelete = 2
	opSynced = 3 // the whole state has been sent; changes follow
	opPing   = 4 // the leader's keepalive: no record
	opAck    = 5 // the standby's acknowledgement, and its keepalive
)

// maxHello bounds the standby's first message: a Pod name is at most 253 bytes.
const maxHello = 512

// record is one record the leader sends: a key and its value (nil: the key is removed), or the
// marker that the whole state has been sent.
type record struct {
	key    string
	value  []byte
	synced bool
}

func (rc record) frame() []byte {
	if rc.synced {
		return []byte{opSynced, 0, 0}
	}
	op := byte(opSet)
	if rc.value == nil {
		op = opDelete
	}
	b := make([]byte, 0, 3+len(rc.key)+len(rc.value))
	b = append(b, op)
	b = binary.BigEndian.AppendUint16(b, uint16(len(rc.key)))
	b = append(b, rc.key...)
	return append(b, rc.value...)
}

var pingFrame = []byte{opPing, 0, 0}

// readRecord reads a frame the leader sent. A set's value is copied: the frame's buffer is reused.
func readRecord(b []byte) (op byte, key string, value []byte, err error) {
	if len(b) < 3 {
		return 0, "", nil, errors.New("ha: replication record too short")
	}
	op, n := b[0], int(binary.BigEndian.Uint16(b[1:3]))
	if len(b) < 3+n || op < opSet || op > opPing {
		return 0, "", nil, errors.New("ha: replication record does not read")
	}
	key, value = string(b[3:3+n]), b[3+n:]
	switch op {
	case opSet:
		value = append([]byte{}, value...)
	case opDelete:
		value = nil
	case opSynced, opPing:
		if n != 0 || len(value) != 0 {
			return 0, "", nil, errors.New("ha: replication marker with a body")
		}
		key, value = "", nil
	}
	return op, key, value, nil
}

func ackFrame(n uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{opAck, 0, 0}, n)
}

// readAck reads a frame the standby sent after its hello: only acks.
func readAck(b []byte) (uint64, error) {
	if len(b) != 11 || b[0] != opAck || b[1] != 0 || b[2] != 0 {
		return 0, errors.New("ha: a standby's frame is not an acknowledgement")
	}
	return binary.BigEndian.Uint64(b[3:]), nil
}

// hello is the standby's first message.
type hello struct {
	Pod string `json:"pod"`
}

func helloFrame(pod string) []byte {
	b, _ := json.Marshal(hello{Pod: pod})
	return b
}

// readHello reads the standby's first message: exactly { "pod": <a Pod name> }, in the form
// helloFrame writes (no other member, no space, the name a DNS subdomain as Pod names are).
func readHello(b []byte) (string, error) {
	if len(b) > maxHello {
		return "", errHello
	}
	var h struct {
		Pod *string `json:"pod"`
	}
	if err := json.Unmarshal(b, &h); err != nil || h.Pod == nil || !bytes.Equal(b, helloFrame(*h.Pod)) {
		return "", errHello
	}
	if len(validation.IsDNS1123Subdomain(*h.Pod)) > 0 {
		return "", errPodRefused
	}
	return *h.Pod, nil
}
