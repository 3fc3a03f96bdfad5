package ha

import (
	"bytes"
	"crypto/rand"
	"net"
	"testing"
)

func pipeChannels(t *testing.T, standbyKey, leaderKey []byte) (*channel, *channel, error, error) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	type res struct {
		ch  *channel
		err error
	}
	leader := make(chan res, 1)
	go func() {
		ch, err := handshake(b, leaderKey, false)
		if err != nil {
			b.Close()
		}
		leader <- res{ch, err}
	}()
	standby, err := handshake(a, standbyKey, true)
	if err != nil {
		a.Close()
	}
	l := <-leader
	return standby, l.ch, err, l.err
}

func TestChannelCarriesFramesOfAnySize(t *testing.T) {
	key := make([]byte, 32)
	rand.Read(key)
	standby, leader, err1, err2 := pipeChannels(t, key, key)
	if err1 != nil || err2 != nil {
		t.Fatalf("handshake: %v, %v", err1, err2)
	}
	frames := [][]byte{{}, []byte("x"), bytes.Repeat([]byte("r"), chunk-4), bytes.Repeat([]byte("s"), chunk), bytes.Repeat([]byte("t"), 300<<10)}
	go func() {
		for _, f := range frames {
			if err := leader.writeFrame(f); err != nil {
				return
			}
		}
	}()
	for i, want := range frames {
		got, err := standby.readFrame(maxFrame)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("frame %d: %d bytes, want %d", i, len(got), len(want))
		}
	}
	if err := leader.writeFrame(make([]byte, maxFrame+1)); err != errFrameTooLarge {
		t.Fatalf("a frame past the bound: %v", err)
	}
}

// TestChannelRefusesAnotherKey: both ends prove the shared key; a peer without it learns nothing.
func TestChannelRefusesAnotherKey(t *testing.T) {
	k1, k2 := make([]byte, 32), make([]byte, 32)
	rand.Read(k1)
	rand.Read(k2)
	_, _, err1, err2 := pipeChannels(t, k1, k2)
	if err1 == nil && err2 == nil {
		t.Fatal("a handshake under two different keys succeeded")
	}
}

func TestRecordsRoundTrip(t *testing.T) {
	for _, rc := range []record{{key: "run/node-a", value: []byte(`{"a":1}`)}, {key: "pair/node-b"}, {synced: true}, {key: "key", value: []byte{}}} {
		op, key, value, err := readRecord(rc.frame())
		if err != nil {
			t.Fatalf("%+v: %v", rc, err)
		}
		switch {
		case rc.synced && op != opSynced, !rc.synced && key != rc.key, rc.value != nil && !bytes.Equal(value, rc.value), rc.value == nil && !rc.synced && op != opDelete:
			t.Fatalf("%+v came back as op %d key %q value %q", rc, op, key, value)
		}
	}
}

// FuzzReadRecord: a record is peer bytes (after the channel's authentication); no input may make
// the reader fail otherwise than by an error.
func FuzzReadRecord(f *testing.F) {
	f.Add(record{key: "run/node-a", value: []byte(`{}`)}.frame())
	f.Add(record{synced: true}.frame())
	f.Add([]byte{opDelete, 0xff, 0xff})
	f.Add(pingFrame)
	f.Add([]byte{opPing, 0, 1, 'x'})
	f.Fuzz(func(t *testing.T, b []byte) {
		op, key, value, err := readRecord(b)
		if err != nil {
			return
		}
		switch op {
		case opSynced, opPing:
			if len(b) != 3 || key != "" || value != nil {
				t.Fatalf("%q read as marker %d with key %q value %q", b, op, key, value)
			}
		case opSet:
			if back := (record{key: key, value: value}); !bytes.Equal(back.frame(), b) {
				t.Fatalf("%q read as key %q value %q, which frames back as %q", b, key, value, back.frame())
			}
		case opDelete:
			if value != nil || !bytes.HasPrefix(b, record{key: key}.frame()) {
				t.Fatalf("%q read as a delete of %q with value %q", b, key, value)
			}
		default:
			t.Fatalf("%q read as op %d", b, op)
		}
	})
}
