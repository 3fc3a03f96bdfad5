package relay_test

import (
	"errors"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/relay"
)

// streamPart is a part that is one end of VirtualStreams with Cloudly (feature.Streams).
type streamPart struct {
	up     feature.Upstream
	frames chan []byte
}

func (p *streamPart) UseUpstream(up feature.Upstream) { p.up = up }
func (p *streamPart) StreamFrame(frame []byte)        { p.frames <- frame }

// TestLocalStreams: a part opens a stream with Cloudly through the upstream's ports: its frames
// reach Cloudly whole and charged to the part's share until written; Cloudly's frames for it reach
// the part, never a node, and a node cannot speak on it; it ends when the Cloudly socket does.
func TestLocalStreams(t *testing.T) {
	part := &streamPart{frames: make(chan []byte, 16)}
	atCloudly := make(chan []byte, 16)
	e := start(t, relay.Features{Parts: []relay.Part{{Name: "streams", Impl: part}}})
	e.Cloudly.TapStreams(func(f []byte) {
		select {
		case atCloudly <- append([]byte(nil), f...):
		default:
		}
	})
	mem, ok1 := part.up.(feature.Memory)
	streams, ok2 := part.up.(feature.Streams)
	if !ok1 || !ok2 {
		t.Fatal("the upstream offers no streams or memory port")
	}
	share := mem.NewShare(1 << 20)
	defer share.Close()
	st, err := streams.OpenStream(share, part)
	if err != nil {
		t.Fatal(err)
	}
	out := contracts.AppendKeepAliveFrame(nil, st.ID(), "c1", true)
	if err := st.Send(out); err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-atCloudly:
		if string(f) != string(out) {
			t.Fatalf("Cloudly read %s", f)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the part's frame did not reach Cloudly")
	}
	// The write's charge is given back once the write returns, which Cloudly's read may precede.
	e.Eventually("the frame's charge given back once it is written", func() bool { return e.Metric("relay_downstream_budget_used_bytes") == 0 })

	// Cloudly's answer to it reaches the part (the stand-in answers a stream it does not know).
	select {
	case f := <-part.frames:
		if a, err := contracts.ReadStreamFrameBody(f); err != nil || a.Response.StreamID != st.ID() || a.Response.CycleID != "c1" {
			t.Fatalf("the part got %s", f)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Cloudly's answer did not reach the part")
	}
	// And a frame Cloudly sends for it, as sent.
	in := contracts.AppendStreamAnswer(nil, contracts.StreamAnswer{StreamID: st.ID(), CycleID: "c1", Purpose: "keepAlive", KeepAlive: true})
	if err := e.Cloudly.SendStreamFrame(in); err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-part.frames:
		if string(f) != string(in) {
			t.Fatalf("the part got %s", f)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Cloudly's frame did not reach the part")
	}
	// A node speaking on the relay's own stream is refused by name.
	n := dialRaw(t, e, "node-a")
	env := n.call("n1", contracts.MethodVirtualStream, `{"streamId":"`+st.ID()+`","cycleId":"x","cycle":"request","mainPurpose":"keepAlive"}`)
	if env.Error == nil || contracts.ReadRefusalName(env.Error.Text, nil) != contracts.RelayStreamUnknown {
		t.Fatalf("a node's frame on the relay's stream: %+v", env)
	}
	select {
	case f := <-part.frames:
		t.Fatalf("a node's frame reached the part: %s", f)
	default:
	}

	// The stream ends with its socket; a stream id held already cannot be taken twice.
	if _, err := streams.AcceptStream(st.ID(), share, part); !errors.Is(err, contracts.RelayStreamUnknown) {
		t.Fatalf("a held id accepted again: %v", err)
	}
	e.Cloudly.Drop()
	select {
	case <-st.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the stream outlived its socket")
	}
	if err := st.Send(out); !errors.Is(err, contracts.RelayUpstreamDetached) {
		t.Fatalf("a frame on an ended stream: %v", err)
	}
}
