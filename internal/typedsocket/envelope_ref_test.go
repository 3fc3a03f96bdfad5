package typedsocket

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/testenv/frames"
)

// referenceDecode is Decode as it was before it read a frame in one pass (envelope.go at 45fa1cf):
// it read the frame, then the stream id from the request (and response) bodies again, with
// contracts.ReadStreamFrameID as it was then (referenceReadStreamFrameID), and it notes a request's
// or stream frame's relayNodeId as Decode does since. TestDecodeMatchesReference and
// FuzzDecodeMatchesReference hold Decode to it.
func referenceDecode(frame []byte) (Envelope, error) {
	var env Envelope
	var method, correlation, request, response, errRaw, retry, relayNode []byte
	var seen uint8
	err := strictjson.ForEachMember(frame, func(key, value []byte) error {
		var bit uint8
		if string(key) == "relayNodeId" {
			relayNode = value
			return nil
		}
		switch string(key) {
		case "method":
			method, bit = value, 1
		case "correlation":
			correlation, bit = value, 2
		case "request":
			request, bit = value, 4
		case "response":
			response, bit = value, 8
		case "error":
			errRaw, bit = value, 16
		case "retry":
			retry, bit = value, 32
		default:
			return nil
		}
		if seen&bit != 0 {
			return strictjson.ErrDuplicateKey
		}
		seen |= bit
		return nil
	})
	if err != nil {
		return Envelope{}, &DecodeError{Reason: "not a JSON object with distinct keys: " + err.Error()}
	}
	m, err := strictjson.ReadString(method)
	methodOK := err == nil && m != "" && len(m) <= MaxMethodLen
	if methodOK {
		env.Method = m
	}
	id, phase, corrOK := readCorrelation(correlation)
	if corrOK {
		env.ID, env.Phase = id, phase
	}
	bad := func(reason string) (Envelope, error) {
		return Envelope{}, &DecodeError{Method: env.Method, ID: env.ID, Phase: env.Phase, Stream: env.Method == contracts.MethodVirtualStream, Reason: reason}
	}
	if env.Method == contracts.MethodVirtualStream {
		// The library's stream frames carry no correlation and keep phase "request" in their
		// answers; they are routed by streamId alone and forwarded whole. A frame naming no
		// stream is either a refusal answering a stream frame sent with a correlation (phase
		// response: read as any answer) or one nobody can route.
		id, ok := referenceReadStreamFrameID(request, response)
		switch {
		case ok:
			env.StreamID, env.Request, env.Response, env.RelayNodeRaw = id, request, response, relayNode
			return env, nil
		case !corrOK || env.Phase == PhaseRequest:
			return bad("a stream frame must name its streamId")
		}
	}
	if !corrOK {
		return Envelope{}, &DecodeError{Method: env.Method, Reason: "correlation must carry an id of 1 to 128 bytes and a phase"}
	}
	if !methodOK {
		return bad("method must be a string of 1 to 256 bytes")
	}
	if env.Phase == PhaseRequest {
		if strictjson.KindOf(request) != strictjson.KindObject {
			return bad("request must be an object")
		}
		env.Request, env.RelayNodeRaw = request, relayNode
		return env, nil
	}
	if errRaw != nil && !strictjson.IsNull(errRaw) {
		var textRaw, data []byte
		if strictjson.ReadTolerant(errRaw, strictjson.Req("text", &textRaw), strictjson.Opt("data", &data)) != nil {
			return bad("error must be an object with one text")
		}
		t, err := strictjson.ReadString(textRaw)
		if err != nil {
			return bad("error text must be a string")
		}
		env.Error = &Error{Text: t, Data: data}
	} else if response != nil {
		env.Response = response // any JSON value, passed on untouched
	}
	if retry != nil && !strictjson.IsNull(retry) {
		env.Retry = retry
	}
	return env, nil
}

// decodeMatchesReference fails t when Decode and referenceDecode read frame differently.
func decodeMatchesReference(t *testing.T, frame []byte) {
	t.Helper()
	env, err := Decode(frame)
	want, wantErr := referenceDecode(frame)
	var de, wantDE *DecodeError
	if (err == nil) != (wantErr == nil) || err != nil && (!errors.As(err, &de) || !errors.As(wantErr, &wantDE) || *de != *wantDE) {
		t.Fatalf("Decode(%q): %v, the reference: %v", frame, err, wantErr)
	}
	if !reflect.DeepEqual(env, want) {
		t.Fatalf("Decode(%q) = %+v, the reference %+v", frame, env, want)
	}
}

func TestDecodeMatchesReference(t *testing.T) {
	inputs := []string{
		`{"method":"##VirtualStream##","request":{"streamId":"s","streamId":"t"},"response":{"streamId":"r"}}`,
		`{"method":"##VirtualStream##","request":{"streamId":"s","streamId":"t"},"response":null}`,
		`{"method":"##VirtualStream##","request":{"streamId":5},"response":{"streamId":"r"}}`,
		`{"method":"##VirtualStream##","request":{"stream\u0049d":"esc"},"response":null}`,
		`{"method":"##VirtualStream##","request":{"a":{"streamId":"deep"}},"response":null}`,
		`{"method":"##VirtualStream##","request":null,"response":{"streamId":""}}`,
		`{"method":"##VirtualStream##","request":{"streamId":"s"},"request":{"streamId":"s"}}`,
		`{"method":"##VirtualStream##","request":{"streamId":"s"},"response":null,"correlation":{"id":"1","phase":"response"}}`,
		`{"method":"##VirtualStream##","request":{"streamId":"s",},"response":null}`,
		`{"method":"m","request":{"streamId":"s","streamId":"t"},"response":null,"correlation":{"id":"1","phase":"request"}}`,
		`{"method":"##VirtualStream##","request":{"streamId":"` + strings.Repeat("x", 257) + `"},"response":null}`,
		string(frames.ChunkFrame(100, false)), string(frames.ChunkFrame(100, true)),
		`{"method":"m","relayNodeId":"n","request":{},"response":null,"correlation":{"id":"1","phase":"request"}}`,
		`{"method":"##VirtualStream##","relay\u004eodeId":1,"request":{"streamId":"s"},"response":null,"relayNodeId":"n"}`,
		`{"method":"m","relayNodeId":"n","response":{},"correlation":{"id":"1","phase":"response"}}`,
	}
	for _, f := range inputs {
		decodeMatchesReference(t, []byte(f))
		for n := range len(f) {
			decodeMatchesReference(t, []byte(f[:n]))
		}
	}
}

func FuzzDecodeMatchesReference(f *testing.F) {
	f.Add([]byte(`{"method":"##VirtualStream##","request":{"streamId":"s","cycleId":"c","cycle":"request","mainPurpose":"chunk","chunkData":{"0":1}},"response":null}`))
	f.Add([]byte(`{"method":"##VirtualStream##","request":null,"response":{"streamId":"r","cycle":"response"},"correlation":{"id":"1","phase":"response"}}`))
	f.Add([]byte(`{"method":"m","request":{"session":{"nodeId":"n"}},"response":null,"correlation":{"id":"1","phase":"request"}}`))
	f.Add([]byte(`{"method":"m","request":{},"response":null,"correlation":{"id":"x","phase":"response"},"error":{"text":"t","data":{"code":"c"}},"retry":{"waitForMs":1}}`))
	f.Fuzz(decodeMatchesReference)
}

// referenceReadStreamFrameID is contracts.ReadStreamFrameID at 45fa1cf.
func referenceReadStreamFrameID(request, response []byte) (streamID string, ok bool) {
	for _, body := range [2][]byte{request, response} {
		if strictjson.KindOf(body) != strictjson.KindObject {
			continue
		}
		raw, has, err := strictjson.Lookup(body, "streamId")
		if err != nil || !has {
			continue
		}
		if id, err := strictjson.ReadString(raw); err == nil && id != "" && len(id) <= contracts.MaxStreamIDLen {
			return id, true
		}
	}
	return "", false
}
