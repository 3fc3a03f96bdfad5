package ha

import (
	"bytes"
	"strings"
	"testing"
)

func TestHelloReadsOnlyItsOwnForm(t *testing.T) {
	if pod, err := readHello(helloFrame("relay-b")); err != nil || pod != "relay-b" {
		t.Fatalf("a standby's hello: %q, %v", pod, err)
	}
	for b, want := range map[string]error{
		`{"pod":"relay-b","x":1}`: errHello,
		`{ "pod": "relay-b" }`:    errHello,
		`{"POD":"relay-b"}`:       errHello,
		`{"pod":null}`:            errHello,
		`{"pod":"relay-b"}{}`:     errHello,
		`[]`:                      errHello,
		`{"pod":"Relay-B"}`:       errPodRefused,
		`{"pod":""}`:              errPodRefused,
		`{"pod":"` + strings.Repeat("a", 300) + `"}`: errPodRefused,
		`{"pod":"` + strings.Repeat("a", 600) + `"}`: errHello,
	} {
		if _, err := readHello([]byte(b)); err != want {
			t.Errorf("%.40s: %v, want %v", b, err, want)
		}
	}
}

// FuzzReadHello: the standby's first message is the first peer bytes the leader reads after the
// handshake; whatever it takes, it names a Pod that a hello frames back to the same bytes.
func FuzzReadHello(f *testing.F) {
	f.Add(helloFrame("relay-b"))
	f.Add([]byte(`{"pod":"relay-b","role":1}`))
	f.Add([]byte(`{"pod":"\u0072elay"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		pod, err := readHello(b)
		if err != nil {
			return
		}
		if !bytes.Equal(helloFrame(pod), b) || pod == "" || len(pod) > 253 {
			t.Fatalf("%q read as Pod %q", b, pod)
		}
	})
}

// FuzzReadAck: a standby's frame after its hello; only an acknowledgement reads, and it frames
// back to the same bytes.
func FuzzReadAck(f *testing.F) {
	f.Add(ackFrame(7))
	f.Add(pingFrame)
	f.Add([]byte{opAck, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := readAck(b)
		if err != nil {
			return
		}
		if !bytes.Equal(ackFrame(n), b) {
			t.Fatalf("%x read as ack %d", b, n)
		}
	})
}
