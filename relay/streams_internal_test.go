package relay

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
)

// TestStreamTable drives the stream bindings with an injected clock: no sockets, no sleeping.
func TestStreamTable(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	a, b := &peer{id: 1}, &peer{id: 2}

	t.Run("a bound stream routes both ways, and only from its own node", func(t *testing.T) {
		st := newStreamTable()
		if err := st.bind([]string{"s"}, a, t0); err != nil {
			t.Fatal(err)
		}
		if to, err := st.route("s", nil, false, t0); err != nil || to != a {
			t.Fatalf("Cloudly's frame routes to %v, %v; want node a", to, err)
		}
		if _, err := st.route("s", a, false, t0); err != nil {
			t.Fatalf("node a's own frame: %v", err)
		}
		if _, err := st.route("s", b, false, t0); !errors.Is(err, contracts.RelayStreamUnknown) {
			t.Fatalf("node b's frame for a's stream: %v, want relay-stream-unknown", err)
		}
		if _, err := st.route("never", nil, false, t0); !errors.Is(err, contracts.RelayStreamUnknown) {
			t.Fatalf("a stream never bound: %v, want relay-stream-unknown", err)
		}
	})
	t.Run("another connection cannot take a bound stream over", func(t *testing.T) {
		st := newStreamTable()
		st.bind([]string{"s"}, a, t0)
		if err := st.bind([]string{"x", "s"}, b, t0); !errors.Is(err, contracts.RelayStreamUnknown) {
			t.Fatalf("b binding a's stream: %v, want relay-stream-unknown", err)
		}
		if st.len() != 1 {
			t.Fatalf("a refused bind bound %d streams; want all or none", st.len()-1)
		}
		if to, _ := st.route("s", nil, false, t0); to != a {
			t.Fatal("the stream moved to the other connection")
		}
	})
	t.Run("the per-connection and total limits refuse the body, all or none", func(t *testing.T) {
		st := newStreamTable()
		ids := func(prefix string, n int) []string {
			out := make([]string, n)
			for i := range out {
				out[i] = fmt.Sprintf("%s-%d", prefix, i)
			}
			return out
		}
		if err := st.bind(ids("a", maxStreamsPerPeer), a, t0); err != nil {
			t.Fatal(err)
		}
		if err := st.bind([]string{"one-more"}, a, t0); !errors.Is(err, contracts.RelayNodeBusy) {
			t.Fatalf("stream %d on one connection: %v, want relay-node-busy", maxStreamsPerPeer+1, err)
		}
		if err := st.bind([]string{"a-0", "a-1"}, a, t0); err != nil {
			t.Fatalf("re-marking bound streams counts as new: %v", err)
		}
		peers := make([]*peer, maxStreams/maxStreamsPerPeer)
		for i := range peers {
			peers[i] = &peer{id: uint64(10 + i)}
			if i == 0 {
				peers[0] = a
				continue
			}
			if err := st.bind(ids(fmt.Sprint("p", i), maxStreamsPerPeer), peers[i], t0); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.bind([]string{"over"}, &peer{id: 999}, t0); !errors.Is(err, contracts.RelayNodeBusy) {
			t.Fatalf("stream %d in all: %v, want relay-node-busy", maxStreams+1, err)
		}
	})
	t.Run("a binding ends after its closing chunk, once the linger is over", func(t *testing.T) {
		st := newStreamTable()
		st.bind([]string{"s"}, a, t0)
		st.route("s", a, true, t0)
		if _, err := st.route("s", nil, false, t0.Add(streamLinger/2)); err != nil {
			t.Fatalf("the closing chunk's answer must still cross: %v", err)
		}
		st.sweep(t0.Add(streamLinger))
		if _, err := st.route("s", nil, false, t0.Add(streamLinger)); !errors.Is(err, contracts.RelayStreamUnknown) {
			t.Fatalf("after the linger: %v, want relay-stream-unknown", err)
		}
	})
	t.Run("a binding ends after 60 s without a frame, not before", func(t *testing.T) {
		st := newStreamTable()
		st.bind([]string{"s"}, a, t0)
		st.route("s", nil, false, t0.Add(30*time.Second)) // a frame renews it
		if st.sweep(t0.Add(30*time.Second + streamIdle - time.Millisecond)); st.len() != 1 {
			t.Fatal("a stream with a frame 60 s ago minus 1 ms was ended")
		}
		if n := st.sweep(t0.Add(30*time.Second + streamIdle)); n != 1 || st.len() != 0 {
			t.Fatalf("an idle stream was not ended (%d ended)", n)
		}
	})
	t.Run("a departed node's streams are gone to Cloudly, then forgotten", func(t *testing.T) {
		st := newStreamTable()
		st.bind([]string{"s1", "s2"}, a, t0)
		st.bind([]string{"t"}, b, t0)
		st.peerGone(a, t0)
		if _, err := st.route("s1", nil, false, t0); !errors.Is(err, contracts.RelayStreamGone) {
			t.Fatalf("Cloudly's frame after the node left: %v, want relay-stream-gone", err)
		}
		if _, err := st.route("t", nil, false, t0); err != nil {
			t.Fatalf("another node's stream was ended: %v", err)
		}
		st.sweep(t0.Add(streamGoneFor))
		if _, err := st.route("s1", nil, false, t0.Add(streamGoneFor)); !errors.Is(err, contracts.RelayStreamUnknown) {
			t.Fatalf("long after: %v, want relay-stream-unknown", err)
		}
		if err := st.bind([]string{"s1"}, b, t0); err != nil {
			t.Fatalf("a gone stream's id cannot be bound again: %v", err)
		}
	})
}
