package typedsocket

import (
	"bytes"
	"testing"
)

// TestRelayNodeID: a request is written with relayNodeId beside method and request when it states
// a node, and without it otherwise; Decode notes what a request or stream frame carried, raw and
// without judging it, and drops it from an answer.
func TestRelayNodeID(t *testing.T) {
	env := Envelope{Method: "reportRuntimeAssignmentObservation", ID: "7", Phase: PhaseRequest, Request: []byte(`{"a":1}`), RelayNodeID: "-node_a"}
	out := env.Append(nil)
	const want = `{"method":"reportRuntimeAssignmentObservation","relayNodeId":"-node_a","request":{"a":1},"response":null,"correlation":{"id":"7","phase":"request"}}`
	if string(out) != want {
		t.Fatalf("Append = %s\nwant     %s", out, want)
	}
	if len(out) > env.Size() {
		t.Fatalf("Size %d is below the %d bytes written", env.Size(), len(out))
	}
	back, err := Decode(out)
	if err != nil || string(back.RelayNodeRaw) != `"-node_a"` || back.RelayNodeID != "" || string(back.Request) != `{"a":1}` {
		t.Fatalf("Decode = %+v, %v", back, err)
	}
	env.RelayNodeID = ""
	if out := env.Append(nil); bytes.Contains(out, []byte("relayNodeId")) {
		t.Fatalf("a request stating no node was written with one: %s", out)
	}
	for _, c := range []struct{ frame, raw string }{
		{`{"method":"m","relayNodeId":"x","relayNodeId":{"y":1},"request":{},"correlation":{"id":"1","phase":"request"}}`, `{"y":1}`},
		{`{"method":"m","relay\u004eodeId":"x","request":{},"correlation":{"id":"1","phase":"request"}}`, `"x"`},
		{`{"method":"##VirtualStream##","relayNodeId":"x","request":{"streamId":"s"},"response":null}`, `"x"`},
		{`{"method":"m","relayNodeId":"x","response":{},"correlation":{"id":"1","phase":"response"}}`, ``},
	} {
		env, err := Decode([]byte(c.frame))
		if err != nil || string(env.RelayNodeRaw) != c.raw {
			t.Errorf("Decode(%s): RelayNodeRaw %s, %v; want %s", c.frame, env.RelayNodeRaw, err, c.raw)
		}
	}
}

// TestWithoutRelayNodeID: a stream frame loses its relayNodeId members, escaped ones included,
// and nothing else: every other member keeps its bytes and its order.
func TestWithoutRelayNodeID(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"method":"##VirtualStream##","relayNodeId":"n","request":{"streamId":"s","relayNodeId":"inner"},"response":null}`,
			`{"method":"##VirtualStream##","request":{"streamId":"s","relayNodeId":"inner"},"response":null}`},
		{`{"relay\u004eodeId":"n", "method" : "##VirtualStream##","request":{"streamId":"s"},"relayNodeId":1}`,
			`{"method":"##VirtualStream##","request":{"streamId":"s"}}`},
		{`{"method":"##VirtualStream##","request":{"streamId":"s"}}`, `{"method":"##VirtualStream##","request":{"streamId":"s"}}`},
	} {
		if got := WithoutRelayNodeID([]byte(c.in)); string(got) != c.want {
			t.Errorf("WithoutRelayNodeID(%s)\n = %s\nwant %s", c.in, got, c.want)
		}
	}
}

// FuzzWithoutRelayNodeID: whatever frame a node sends, what the relay forwards carries no
// relayNodeId and reads as the same envelope.
func FuzzWithoutRelayNodeID(f *testing.F) {
	f.Add([]byte(`{"method":"##VirtualStream##","relayNodeId":"n","request":{"streamId":"s","cycleId":"c","cycle":"request","mainPurpose":"chunk","chunkData":{"0":1}},"response":null}`))
	f.Add([]byte(`{"relay\u004eodeId":"n","method":"##VirtualStream##","request":null,"response":{"streamId":"r"},"correlation":{"id":"1","phase":"response"}}`))
	f.Fuzz(func(t *testing.T, frame []byte) {
		env, err := Decode(frame)
		if err != nil {
			return
		}
		out := WithoutRelayNodeID(frame)
		back, err := Decode(out)
		if err != nil {
			t.Fatalf("%q became unreadable %q: %v", frame, out, err)
		}
		if back.RelayNodeRaw != nil {
			t.Fatalf("%q kept a relayNodeId: %q", frame, out)
		}
		if back.Method != env.Method || back.ID != env.ID || back.Phase != env.Phase || back.StreamID != env.StreamID ||
			string(back.Request) != string(env.Request) || string(back.Response) != string(env.Response) {
			t.Fatalf("%q read differently once stripped: %q", frame, out)
		}
		if noted := env.Phase == PhaseRequest || env.IsStream(); noted && env.RelayNodeRaw == nil && !bytes.Equal(out, frame) {
			t.Fatalf("a frame without relayNodeId was changed: %q -> %q", frame, out)
		}
	})
}
