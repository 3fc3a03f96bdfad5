package relay_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// rawNode is a node that speaks raw WebSocket frames, as the published TypedRequest library puts
// them on the wire: what it writes reaches the relay byte for byte, and what it reads is what the
// relay sent.
type rawNode struct {
	t  *testing.T
	ws *websocket.Conn
}

// dialRaw connects and registers node id with a registration frame Cloudly accepts.
func dialRaw(t *testing.T, e *env, id string) *rawNode {
	t.Helper()
	ws, _, err := websocket.Dial(ctxHung(t), e.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(64 << 20)
	t.Cleanup(func() { ws.CloseNow() })
	n := &rawNode{t: t, ws: ws}
	reg := sim.NewNode(id, zerolog.Nop()).RegistrationBody()
	n.write(`{"method":"registerPalletRuntimeSession","request":` + string(reg) + `,"response":null,"correlation":{"id":"reg","phase":"request"},"localData":null}`)
	if env := n.read(); env.ID != "reg" || env.Error != nil {
		t.Fatalf("registration answer: %+v", env)
	}
	return n
}

func (n *rawNode) write(frame string) {
	n.t.Helper()
	if err := n.ws.Write(ctxHung(n.t), websocket.MessageText, []byte(frame)); err != nil {
		n.t.Fatal(err)
	}
}

func (n *rawNode) readRaw() []byte {
	n.t.Helper()
	_, b, err := n.ws.Read(ctxHung(n.t))
	if err != nil {
		n.t.Fatalf("read: %v", err)
	}
	return b
}

func (n *rawNode) read() typedsocket.Envelope {
	n.t.Helper()
	b := n.readRaw()
	env, err := typedsocket.Decode(b)
	if err != nil {
		n.t.Fatalf("the relay sent an unreadable frame %s: %v", b, err)
	}
	return env
}

// call sends one request frame and returns its answer.
func (n *rawNode) call(id, method, body string) typedsocket.Envelope {
	n.t.Helper()
	n.write(`{"method":` + string(strictjson.AppendString(nil, method)) + `,"request":` + body +
		`,"response":null,"correlation":{"id":"` + id + `","phase":"request"},"localData":null,"serverData":null}`)
	env := n.read()
	if env.ID != id {
		n.t.Fatalf("answer to %s has id %q", id, env.ID)
	}
	return env
}

func session(id string) string { return `{"session":{"nodeId":"` + id + `"}` }

// TestStreams carries the published library's VirtualStreams (docs/protocol.md#streams) through a real relay.
// The streams are 256 KiB and 17 bytes in 32 KiB chunks: eight whole chunks and a short one, each
// answered before the next (RELAY_FAULTS=long: 3 MiB and 17 bytes in 256 KiB chunks). A chunk
// crosses the relay as JSON of three to four bytes a byte, which the race detector follows byte by
// byte: more chunks of the same kind show nothing more.
func TestStreams(t *testing.T) {
	e := start(t, relay.Features{})
	data := make([]byte, sized(256<<10, 3<<20)+17)
	chunk := sized(32<<10, 256<<10)
	rand.Read(data)

	t.Run("a node's stream reaches Cloudly byte-identical", func(t *testing.T) {
		n := e.node("node-a")
		if err := n.PushImage(ctxHung(t), data, chunk); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("Cloudly's stream reaches a node byte-identical", func(t *testing.T) {
		n := e.node("node-b")
		if err := e.cloudly.PushImage(ctxHung(t), "node-b", data, chunk); err != nil {
			t.Fatal(err)
		}
		if n.StreamsReceived() != 1 {
			t.Fatalf("node received %d streams", n.StreamsReceived())
		}
	})

	t.Run("frames are forwarded whole and untouched, both ways, routed by their streamId", func(t *testing.T) {
		var mu sync.Mutex
		var seen [][]byte
		e.cloudly.TapStreams(func(f []byte) { mu.Lock(); seen = append(seen, f); mu.Unlock() })
		defer e.cloudly.TapStreams(nil)
		n := dialRaw(t, e, "node-raw")
		// A marker binds at any depth, beside members the relay does not know, in a request...
		if env := n.call("m1", "reportRuntimeAssignmentObservation",
			`{"session":{"nodeId":"node-raw"},"wrap":[{"x":1,"imageStream":{"_isVirtualStream":true,"streamId":"raw-1","extra":true}}]}`); env.Error != nil {
			t.Fatalf("the marked request was refused: %s", env.Error.Text)
		}
		// ...and in Cloudly's answer.
		e.cloudly.Handle("pullImageVersion", func(json.RawMessage) (json.RawMessage, error) {
			return json.RawMessage(`{"imageStream":{"_isVirtualStream":true,"streamId":"ans-1"}}`), nil
		})
		if env := n.call("m2", "pullImageVersion", session("node-raw")+`}`); env.Error != nil {
			t.Fatalf("the request for a marked answer was refused: %s", env.Error.Text)
		}
		frames := []string{
			// As the library sends them: no correlation, unknown members, localData, odd spacing.
			`{"method":"##VirtualStream##", "request":{"streamId":"raw-1","cycleId":"c1","cycle":"request","mainPurpose":"keepAlive","keepAlive":true,"n":12345678901234567890},"response":null,"localData":null}`,
			// With a correlation a transport may add: forwarded untouched, never rewritten.
			`{"method":"##VirtualStream##","request":{"streamId":"raw-1","cycleId":"c2","cycle":"request","mainPurpose":"feedback"},"response":null,"correlation":{"id":"k2","phase":"request"}}`,
			`{"method":"##VirtualStream##","request":{"streamId":"ans-1","cycleId":"c3","cycle":"request","mainPurpose":"chunk","chunkData":"` + contracts.StreamClosingBit + `"},"response":null}`,
		}
		for _, f := range frames {
			n.write(f)
			// The stand-in answers each frame; its answer comes down untouched, by streamId alone.
			back := n.readRaw()
			env, err := typedsocket.Decode(back)
			if err != nil || !env.IsStream() || env.ID != "" {
				t.Fatalf("Cloudly's stream answer arrived as %s (%v)", back, err)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(seen) != len(frames) {
			t.Fatalf("Cloudly received %d stream frames, want %d", len(seen), len(frames))
		}
		for i := range frames {
			if string(seen[i]) != frames[i] {
				t.Errorf("frame %d changed on the way:\n sent %s\n got  %s", i, frames[i], seen[i])
			}
		}
	})

	t.Run("a frame the relay cannot route is answered by name, or dropped and counted, never closing", func(t *testing.T) {
		n := dialRaw(t, e, "node-lost")
		n.write(`{"method":"##VirtualStream##","request":{"streamId":"nobody","cycleId":"c"},"correlation":{"id":"u1","phase":"request"}}`)
		env := n.read()
		if env.ID != "u1" || env.Error == nil || !strings.HasPrefix(env.Error.Text, string(contracts.RelayStreamUnknown)+": ") {
			t.Fatalf("answer = %+v, want relay-stream-unknown for u1", env)
		}
		// A stream bound to another node is unknown to this one.
		n.write(`{"method":"##VirtualStream##","request":{"streamId":"raw-1","cycleId":"c"},"correlation":{"id":"u2","phase":"request"}}`)
		if env := n.read(); env.ID != "u2" || env.Error == nil || !strings.HasPrefix(env.Error.Text, string(contracts.RelayStreamUnknown)+": ") {
			t.Fatalf("answer = %+v, want relay-stream-unknown for u2", env)
		}
		before := e.Metric("relay_downstream_dropped_total", "reason", string(contracts.RelayStreamUnknown))
		n.write(`{"method":"##VirtualStream##","request":{"streamId":"nobody","cycleId":"c"},"response":null}`)
		e.eventually("the unanswerable frame counted", func() bool {
			return e.Metric("relay_downstream_dropped_total", "reason", string(contracts.RelayStreamUnknown)) == before+1
		})
		if env := n.call("alive", "reportRuntimeAssignmentObservation", session("node-lost")+`}`); env.Error != nil {
			t.Fatalf("the connection did not survive: %s", env.Error.Text)
		}
	})

	t.Run("a departed node's streams are gone to Cloudly", func(t *testing.T) {
		n := dialRaw(t, e, "node-leaves")
		if env := n.call("m", "reportRuntimeAssignmentObservation", `{"session":{"nodeId":"node-leaves"},"s":{"_isVirtualStream":true,"streamId":"left-1"}}`); env.Error != nil {
			t.Fatal(env.Error.Text)
		}
		n.ws.Close(websocket.StatusNormalClosure, "")
		before := e.Metric("relay_downstream_dropped_total", "reason", string(contracts.RelayStreamGone))
		e.eventually("Cloudly's frame for the departed node's stream refused relay-stream-gone", func() bool {
			e.cloudly.SendStreamFrame([]byte(`{"method":"##VirtualStream##","request":{"streamId":"left-1","cycleId":"c","cycle":"request","mainPurpose":"keepAlive"},"response":null}`))
			return e.Metric("relay_downstream_dropped_total", "reason", string(contracts.RelayStreamGone)) > before
		})
	})
}

// TestStreamKeepsItsRequestAlive: a request whose answer waits on the stream it carries (the
// receiver answers once it has the whole stream) is not refused relay-call-timeout while the
// stream moves, however long that takes; each frame gives it another call timeout. The call
// timeout is 800 ms and the writer pauses 100 ms between chunks: twenty chunks last more than
// twice the timeout, and a busy machine may delay a frame by 700 ms before the request times out
// for want of one. (With 400 ms and 10 chunks 100 ms apart, a loaded run once lost a frame's
// 300 ms of slack: relay-call-timeout after 969 ms of a 1 s stream.)
func TestStreamKeepsItsRequestAlive(t *testing.T) {
	const timeout, pace, chunks = 800 * time.Millisecond, 100 * time.Millisecond, 20
	x := relaytest.Start(t, relaytest.Options{CallTimeout: timeout})
	n := x.Node("node-slow")
	n.SetStreamPace(pace)
	x.Cloudly.SetStreamPace(pace)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.PushImage(ctx, make([]byte, chunks<<10), 1<<10); err != nil {
		t.Fatalf("a slow stream's request: %v", err)
	}
	if err := x.Cloudly.PushImage(ctx, "node-slow", make([]byte, chunks<<10), 1<<10); err != nil {
		t.Fatalf("Cloudly's stream to the node: %v", err)
	}
}

// TestLibraryFramesNeverCloseAConnection sends what the published TypedRequest library sends
// (docs/protocol.md#framing-typedrequest-over-websocket): every frame is served or answered by name, and the connection stays open.
func TestLibraryFramesNeverCloseAConnection(t *testing.T) {
	e := start(t, relay.Features{})
	n := dialRaw(t, e, "node-lib")
	t.Run("a method is any string of 1 to 256 bytes", func(t *testing.T) {
		if env := n.call("a", "ns.method with spaces/v2", session("node-lib")+`}`); env.Error != nil {
			t.Fatalf("refused: %s", env.Error.Text)
		}
	})
	t.Run("a request that is not an object is answered relay-request-invalid", func(t *testing.T) {
		n.write(`{"method":"m","request":0,"correlation":{"id":"b","phase":"request"}}`)
		if env := n.read(); env.ID != "b" || !strings.HasPrefix(env.Error.Text, string(contracts.RelayRequestInvalid)+": ") {
			t.Fatalf("answer = %+v", env)
		}
	})
	t.Run("a logs report without session is refused relay-session-foreign", func(t *testing.T) {
		env := n.call("c", "reportRuntimeAssignmentLogs", `{"batch":{}}`)
		if env.Error == nil || !strings.HasPrefix(env.Error.Text, string(contracts.RelaySessionForeign)+": ") {
			t.Fatalf("answer = %+v", env)
		}
	})
	t.Run("an answer with neither response nor error reaches Cloudly as no body", func(t *testing.T) {
		got := make(chan typedsocket.Reply, 1)
		e.cloudly.CallAsync("readRuntimeAssignmentStats", json.RawMessage(session("node-lib")+`}`), func(r typedsocket.Reply) { got <- r })
		req := n.read()
		n.write(`{"method":"readRuntimeAssignmentStats","request":{"x":1},"correlation":{"id":"` + req.ID + `","phase":"response"},"localData":null}`)
		if r := <-got; r.Err != nil || !(r.Response == nil || string(r.Response) == "null") {
			t.Fatalf("Cloudly got %s, %v", r.Response, r.Err)
		}
	})
	t.Run("an error sent without data arrives without data", func(t *testing.T) {
		got := make(chan typedsocket.Reply, 1)
		e.cloudly.CallAsync("readRuntimeAssignmentStats", json.RawMessage(session("node-lib")+`}`), func(r typedsocket.Reply) { got <- r })
		req := n.read()
		n.write(`{"method":"readRuntimeAssignmentStats","response":null,"correlation":{"id":"` + req.ID + `","phase":"response"},"error":{"text":"no such assignment"}}`)
		r := <-got
		remote, ok := r.Err.(*typedsocket.Error)
		if !ok || remote.Text != "no such assignment" || remote.Data != nil {
			t.Fatalf("Cloudly got %#v", r.Err)
		}
	})
	if env := n.call("last", "reportRuntimeAssignmentObservation", session("node-lib")+`}`); env.Error != nil {
		t.Fatalf("the connection did not survive: %s", env.Error.Text)
	}
}
