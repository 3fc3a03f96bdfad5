package relay

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// FuzzStreamFrameRouting reads arbitrary frames as a peer's stream frames are read (Decode, then
// the stream table) and checks the routing decision against a slow reference that decodes the
// whole frame with encoding/json: the stream a frame names, whether it carries the closing chunk,
// and where it goes — to the bound node from Cloudly, up from that node only, refused otherwise.
func FuzzStreamFrameRouting(f *testing.F) {
	for _, s := range []string{
		`{"method":"##VirtualStream##","request":{"streamId":"a","cycleId":"c","cycle":"request","mainPurpose":"keepAlive"},"response":null}`,
		`{"method":"##VirtualStream##","request":null,"response":{"streamId":"b","cycle":"response","mainPurpose":"feedback"},"correlation":{"id":"k","phase":"request"}}`,
		`{"method":"##VirtualStream##","request":{"streamId":"a","mainPurpose":"chunk","chunkData":"#############CLOSING BIT#############"}}`,
		`{"method":"##VirtualStream##","request":{"streamId":"gone"},"localData":null}`,
		`{"method":"##VirtualStream##","request":{},"response":null,"correlation":{"id":"k","phase":"response"},"error":{"text":"relay-stream-unknown: x"}}`,
		`{"method":"m","request":{"streamId":"a"},"correlation":{"id":"1","phase":"request"}}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	t0 := time.Unix(1_700_000_000, 0)
	f.Fuzz(func(t *testing.T, frame []byte, fromNode bool) {
		a, b, left := &peer{id: 1}, &peer{id: 2}, &peer{id: 3}
		st := newStreamTable()
		st.bind([]string{"a"}, a, t0)
		st.bind([]string{"b"}, b, t0)
		st.bind([]string{"gone"}, left, t0)
		st.peerGone(left, t0)

		env, err := typedsocket.Decode(frame)
		ref, refOK := referenceStreamID(frame)
		if err != nil || !env.IsStream() {
			if refOK && err == nil {
				t.Fatalf("the reference reads stream %q in %q; Decode reads no stream frame", ref, frame)
			}
			return
		}
		if refOK && env.StreamID != ref {
			t.Fatalf("Decode reads stream %q, the reference %q, in %q", env.StreamID, ref, frame)
		}
		closing := contracts.IsStreamClosing(frame)
		if closing != strings.Contains(string(frame), `"`+contracts.StreamClosingBit+`"`) {
			t.Fatalf("closing = %v for %q", closing, frame)
		}
		var from *peer
		if fromNode {
			from = a
		}
		to, err := st.route(env.StreamID, from, closing, t0)
		switch id := env.StreamID; {
		case fromNode && id == "a":
			if err != nil || to != nil {
				t.Fatalf("node a's own stream: %v, %v", to, err)
			}
		case !fromNode && (id == "a" || id == "b"):
			if want := map[string]*peer{"a": a, "b": b}[id]; err != nil || to != want {
				t.Fatalf("Cloudly's frame for %s went to %v (%v)", id, to, err)
			}
		case !fromNode && id == "gone":
			if !errors.Is(err, contracts.RelayStreamGone) {
				t.Fatalf("Cloudly's frame for a departed node's stream: %v", err)
			}
		default:
			if !errors.Is(err, contracts.RelayStreamUnknown) || to != nil {
				t.Fatalf("stream %q from node %v: %v, %v; want relay-stream-unknown", id, fromNode, to, err)
			}
		}
	})
}

// referenceStreamID decodes frame with encoding/json and reads a stream frame's id as docs/protocol.md#streams
// states it: request.streamId, else response.streamId.
func referenceStreamID(frame []byte) (string, bool) {
	var env struct {
		Method   string          `json:"method"`
		Request  json.RawMessage `json:"request"`
		Response json.RawMessage `json:"response"`
	}
	if json.Unmarshal(frame, &env) != nil || env.Method != contracts.MethodVirtualStream {
		return "", false
	}
	for _, body := range []json.RawMessage{env.Request, env.Response} {
		var m map[string]json.RawMessage
		if json.Unmarshal(body, &m) != nil || m == nil {
			continue
		}
		var id string
		if raw, ok := m["streamId"]; ok && json.Unmarshal(raw, &id) == nil && id != "" && len(id) <= contracts.MaxStreamIDLen {
			return id, true
		}
	}
	return "", false
}
