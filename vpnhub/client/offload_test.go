package client

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// tcp4 builds an IPv4 TCP packet with a 12-byte timestamp option, checksums valid.
func tcp4(seq uint32, flags byte, payload []byte, srcPort uint16) []byte {
	const hl = 20 + 32
	p := make([]byte, hl+len(payload))
	p[0], p[6], p[8], p[9] = 0x45, 0x40, 64, 6
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	binary.BigEndian.PutUint16(p[4:], 777)
	copy(p[12:], []byte{10, 64, 0, 2, 10, 64, 0, 3})
	setIPv4Checksum(p, 20)
	t := p[20:]
	binary.BigEndian.PutUint16(t[0:], srcPort)
	binary.BigEndian.PutUint16(t[2:], 5201)
	binary.BigEndian.PutUint32(t[4:], seq)
	binary.BigEndian.PutUint32(t[8:], 99)
	t[12], t[13] = 8<<4, flags
	binary.BigEndian.PutUint16(t[14:], 512)
	copy(t[20:], []byte{1, 1, 8, 10, 0, 0, 0, 5, 0, 0, 0, 6})
	copy(p[hl:], payload)
	binary.BigEndian.PutUint16(t[16:], ^fold16(sum16(t, pseudoSum4(p, 6, len(t)))))
	return p
}

func checksumsValid(t *testing.T, p []byte) {
	t.Helper()
	if fold16(sum16(p[:20], 0)) != 0xffff {
		t.Fatal("IPv4 header checksum invalid")
	}
	if fold16(sum16(p[20:], pseudoSum4(p, 6, len(p)-20))) != 0xffff {
		t.Fatal("TCP checksum invalid")
	}
}

func TestSum16MatchesTheSlowChecksum(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 300; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if got, want := ^fold16(sum16(b, 0)), checksum(b); got != want {
			t.Fatalf("%d bytes: %#x, want %#x", n, got, want)
		}
	}
}

func TestSegmentAndCoalesceTCP4RoundTrip(t *testing.T) {
	payload := make([]byte, 10_000)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	const mss = 1336
	super := tcp4(1000, tcpPSH|0x10, payload, 40000)
	segs, ok := segmentTCP4(super, mss, make([]byte, 2*maxIPv4Packet), nil)
	if !ok || len(segs) != 8 {
		t.Fatalf("%d segments, ok %v", len(segs), ok)
	}
	var joined []byte
	for i, s := range segs {
		checksumsValid(t, s)
		want := min(mss, len(payload)-i*mss)
		if len(s) != 52+want || binary.BigEndian.Uint32(s[24:]) != 1000+uint32(i*mss) {
			t.Fatalf("segment %d: %d bytes, seq %d", i, len(s), binary.BigEndian.Uint32(s[24:]))
		}
		if psh := s[33]&tcpPSH != 0; psh != (i == len(segs)-1) {
			t.Fatalf("segment %d PSH %v", i, psh)
		}
		joined = append(joined, s[52:]...)
	}
	if !bytes.Equal(joined, payload) {
		t.Fatal("payload changed")
	}

	var writes [][]byte
	err := coalesceTCP4(segs, 0, make([]byte, virtioNetHdrLen+maxIPv4Packet), func(b []byte) error {
		writes = append(writes, bytes.Clone(b))
		return nil
	})
	if err != nil || len(writes) != 1 {
		t.Fatalf("%d writes, %v", len(writes), err)
	}
	var h virtioNetHdr
	h.decode(writes[0])
	if h.gsoType != virtioGSOTCPv4 || h.gsoSize != mss || h.hdrLen != 52 || h.flags != virtioNeedsCsum || h.csumStart != 20 || h.csumOffset != 16 {
		t.Fatalf("virtio header %+v", h)
	}
	sp := writes[0][virtioNetHdrLen:]
	if !bytes.Equal(sp[52:], payload) || binary.BigEndian.Uint16(sp[2:]) != uint16(len(sp)) || sp[33]&tcpPSH == 0 {
		t.Fatal("super-packet differs from the original")
	}
	// The kernel completes the checksum from the pseudo-header sum in the field.
	finishChecksum(sp, 20, 16)
	checksumsValid(t, sp)
}

func TestCoalesceTCP4KeepsWhatMustStayApart(t *testing.T) {
	pay := bytes.Repeat([]byte{1}, 100)
	cases := []struct {
		name   string
		pkts   [][]byte
		writes int
	}{
		{"two flows", [][]byte{tcp4(1, 0x10, pay, 1), tcp4(101, 0x10, pay, 2)}, 2},
		{"gap in sequence", [][]byte{tcp4(1, 0x10, pay, 1), tcp4(102, 0x10, pay, 1)}, 2},
		{"PSH ends a run", [][]byte{tcp4(1, 0x10|tcpPSH, pay, 1), tcp4(101, 0x10, pay, 1)}, 2},
		{"short segment ends a run", [][]byte{tcp4(1, 0x10, pay[:50], 1), tcp4(51, 0x10, pay, 1)}, 2},
		{"FIN never merged", [][]byte{tcp4(1, 0x10, pay, 1), tcp4(101, 0x10|tcpFIN, pay, 1)}, 2},
		{"pure ACKs", [][]byte{tcp4(1, 0x10, nil, 1), tcp4(1, 0x10, nil, 1)}, 2},
		{"not TCP", [][]byte{ipv4Packet(addrA, addrB, pay), ipv4Packet(addrA, addrB, pay)}, 2},
		{"three in a row, shorter last", [][]byte{tcp4(1, 0x10, pay, 1), tcp4(101, 0x10, pay, 1), tcp4(201, 0x10, pay[:10], 1)}, 1},
	}
	for _, c := range cases {
		var writes [][]byte
		coalesceTCP4(c.pkts, 0, make([]byte, virtioNetHdrLen+maxIPv4Packet), func(b []byte) error {
			writes = append(writes, bytes.Clone(b))
			return nil
		})
		if len(writes) != c.writes {
			t.Errorf("%s: %d writes, want %d", c.name, len(writes), c.writes)
		}
		if len(writes) == len(c.pkts) {
			for i, w := range writes {
				if !bytes.Equal(w[:virtioNetHdrLen], make([]byte, virtioNetHdrLen)) || !bytes.Equal(w[virtioNetHdrLen:], c.pkts[i]) {
					t.Errorf("%s: packet %d not passed through as is", c.name, i)
				}
			}
		}
	}
}

// FuzzSegmentTCP4 cuts arbitrary packets as TSO super-packets: every segment it makes carries
// valid checksums, and merging them again never fails.
func FuzzSegmentTCP4(f *testing.F) {
	f.Add(tcp4(5, 0x18, bytes.Repeat([]byte{3}, 700), 9), uint16(200))
	segBuf, out := make([]byte, 2*maxIPv4Packet), make([]byte, virtioNetHdrLen+maxIPv4Packet)
	f.Fuzz(func(t *testing.T, p []byte, mss uint16) {
		segs, ok := segmentTCP4(p, int(mss), segBuf, nil)
		if !ok {
			return
		}
		for _, s := range segs {
			checksumsValid(t, s)
		}
		if err := coalesceTCP4(segs, 0, out, func([]byte) error { return nil }); err != nil {
			t.Fatal(err)
		}
	})
}
