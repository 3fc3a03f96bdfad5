package typedsocket

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

func TestDecodeRequestKeepsRawBody(t *testing.T) {
	frame := `{"method":"reportRuntimeAssignmentObservation","request":{"n":12345678901234567890,"s":"<&>\u2028"},"response":null,"correlation":{"id":"7","phase":"request"},"authInfo":{"x":1},"localData":{},"serverData":null}`
	env, err := Decode([]byte(frame))
	if err != nil {
		t.Fatal(err)
	}
	if env.Method != "reportRuntimeAssignmentObservation" || env.ID != "7" || env.Phase != PhaseRequest ||
		string(env.Request) != `{"n":12345678901234567890,"s":"<&>\u2028"}` {
		t.Fatalf("env = %+v", env)
	}
	out := string(env.Append(nil))
	if strings.Contains(out, "authInfo") || strings.Contains(out, "localData") || strings.Contains(out, "serverData") {
		t.Fatalf("ignored keys forwarded: %s", out)
	}
	back, err := Decode([]byte(out))
	if err != nil || string(back.Request) != string(env.Request) || back.ID != "7" || back.Method != env.Method {
		t.Fatalf("round trip: %+v %v", back, err)
	}
}

func TestDecodeResponses(t *testing.T) {
	ok, err := Decode([]byte(`{"method":"m","request":{},"response":{"a":[1]},"correlation":{"id":"x","phase":"response"},"retry":{"waitForMs":5,"reason":"r"}}`))
	if err != nil || string(ok.Response) != `{"a":[1]}` || ok.Error != nil || string(ok.Retry) != `{"waitForMs":5,"reason":"r"}` {
		t.Fatalf("ok = %+v, %v", ok, err)
	}
	fail, err := Decode([]byte(`{"method":"m","request":{},"response":null,"correlation":{"id":"x","phase":"response"},"error":{"text":"relay-node-busy: full","data":{"code":"relay-node-busy","n":12345678901234567890}}}`))
	if err != nil || fail.Error == nil || fail.Error.Text != "relay-node-busy: full" ||
		string(fail.Error.Data) != `{"code":"relay-node-busy","n":12345678901234567890}` {
		t.Fatalf("fail = %+v, %v", fail, err)
	}
	if !errors.Is(fail.Error, contracts.RelayNodeBusy) || errors.Is(fail.Error, contracts.RelayNodeNotCarried) {
		t.Fatal("remote error does not match its refusal name")
	}
	again, err := Decode(fail.Append(nil))
	if err != nil || again.Error.Text != fail.Error.Text || string(again.Error.Data) != string(fail.Error.Data) {
		t.Fatalf("error round trip: %+v %v", again, err)
	}
	// An error sent without data travels on without data: no "data":null is invented (docs/protocol.md#framing-typedrequest-over-websocket).
	noData, err := Decode([]byte(`{"method":"m","response":null,"correlation":{"id":"x","phase":"response"},"error":{"text":"t"}}`))
	if err != nil || noData.Error == nil || noData.Error.Data != nil {
		t.Fatalf("error without data: %+v %v", noData, err)
	}
	if out := string(noData.Append(nil)); !strings.Contains(out, `"error":{"text":"t"}`) {
		t.Fatalf("error without data re-encoded as %s", out)
	}
}

// TestDecodeLibraryFrames reads frames exactly as the published TypedRequest library (3.3.0)
// writes them: docs/protocol.md#framing-typedrequest-over-websocket's list of what real peers send.
func TestDecodeLibraryFrames(t *testing.T) {
	t.Run("localData and serverData present, null included", func(t *testing.T) {
		env, err := Decode([]byte(`{"method":"m","request":{"a":1},"response":null,"correlation":{"id":"c1","phase":"request"},"localData":null,"serverData":{"x":1}}`))
		if err != nil || env.Phase != PhaseRequest || string(env.Request) != `{"a":1}` {
			t.Fatalf("env = %+v, %v", env, err)
		}
	})
	t.Run("a method is any string of 1 to 256 bytes", func(t *testing.T) {
		for _, m := range []string{"has space", "ns.method/v2", "##VirtualStreamish##", strings.Repeat("m", MaxMethodLen)} {
			frame := `{"method":` + string(strictjson.AppendString(nil, m)) + `,"request":{},"correlation":{"id":"1","phase":"request"}}`
			if env, err := Decode([]byte(frame)); err != nil || env.Method != m {
				t.Errorf("method %q: %+v %v", m, env, err)
			}
		}
	})
	t.Run("an answer with neither response nor error has no body", func(t *testing.T) {
		env, err := Decode([]byte(`{"method":"m","request":{"a":1},"correlation":{"id":"c","phase":"response"}}`))
		if err != nil || env.Error != nil || env.Response != nil {
			t.Fatalf("env = %+v, %v", env, err)
		}
		if out := string(env.Append(nil)); !strings.Contains(out, `"response":null`) {
			t.Fatalf("re-encoded as %s", out)
		}
	})
	t.Run("an answer body may be any JSON value", func(t *testing.T) {
		env, err := Decode([]byte(`{"method":"m","response":[1,"x"],"correlation":{"id":"c","phase":"response"}}`))
		if err != nil || string(env.Response) != `[1,"x"]` {
			t.Fatalf("env = %+v, %v", env, err)
		}
	})
	t.Run("unknown members of correlation and error are ignored", func(t *testing.T) {
		env, err := Decode([]byte(`{"method":"m","response":null,"correlation":{"id":"c","phase":"response","hop":2},"error":{"text":"t","data":{},"stack":"x"}}`))
		if err != nil || env.Error == nil || env.Error.Text != "t" || string(env.Error.Data) != `{}` {
			t.Fatalf("env = %+v, %v", env, err)
		}
	})
	t.Run("a stream frame without correlation", func(t *testing.T) {
		env, err := Decode([]byte(`{"method":"##VirtualStream##","request":{"streamId":"s1","cycleId":"k","cycle":"request","mainPurpose":"keepAlive","keepAlive":true},"response":null}`))
		if err != nil || !env.IsStream() || env.StreamID != "s1" || env.ID != "" || env.Phase != 0 {
			t.Fatalf("env = %+v, %v", env, err)
		}
	})
	t.Run("a refusal of a stream frame is an answer, not a stream frame", func(t *testing.T) {
		env, err := Decode([]byte(`{"method":"##VirtualStream##","request":{},"response":null,"correlation":{"id":"c","phase":"response"},"error":{"text":"relay-stream-unknown: s9","data":{"code":"relay-stream-unknown"}}}`))
		if err != nil || env.IsStream() || env.Phase != PhaseResponse || !errors.Is(env.Error, contracts.RelayStreamUnknown) {
			t.Fatalf("env = %+v, %v", env, err)
		}
	})
	t.Run("a chunk's answer names its stream in response", func(t *testing.T) {
		env, err := Decode([]byte(`{"method":"##VirtualStream##","request":null,"response":{"streamId":"s2","cycleId":"k","cycle":"response","mainPurpose":"feedback"},"correlation":{"id":"c","phase":"request"}}`))
		if err != nil || env.StreamID != "s2" || env.ID != "c" {
			t.Fatalf("env = %+v, %v", env, err)
		}
	})
}

func TestDecodeRefusals(t *testing.T) {
	cases := []struct {
		frame      string
		answerable bool
	}{
		{`not json`, false},
		{`[]`, false},
		{`{"method":"m","method":"n","request":{},"correlation":{"id":"1","phase":"request"}}`, false},
		{`{"method":"","request":{},"correlation":{"id":"1","phase":"request"}}`, true},
		{`{"method":7,"request":{},"correlation":{"id":"1","phase":"request"}}`, true},
		{`{"method":"m","request":{},"correlation":{"id":"","phase":"request"}}`, false},
		{`{"method":"m","request":{},"correlation":{"id":"1","phase":"other"}}`, false},
		{`{"method":"m","request":{},"correlation":{"id":"1"}}`, false},
		{`{"method":"m","request":[],"correlation":{"id":"1","phase":"request"}}`, true},
		{`{"method":"m","correlation":{"id":"1","phase":"request"}}`, true},
		{`{"method":"m","response":null,"error":{"text":1},"correlation":{"id":"1","phase":"response"}}`, true},
		{`{"method":"m","response":null,"error":{"data":{}},"correlation":{"id":"1","phase":"response"}}`, true},
		// A stream frame that names no stream: answerable only with a correlation.
		{`{"method":"##VirtualStream##","request":{"cycleId":"k"},"correlation":{"id":"1","phase":"request"}}`, true},
		{`{"method":"##VirtualStream##","request":{"cycleId":"k"}}`, false},
	}
	for _, c := range cases {
		_, err := Decode([]byte(c.frame))
		var de *DecodeError
		if !errors.As(err, &de) {
			t.Errorf("Decode(%s) = %v, want a DecodeError", c.frame, err)
			continue
		}
		if (de.ID != "") != c.answerable {
			t.Errorf("Decode(%s): answerable = %v", c.frame, de.ID != "")
		}
	}
}

func TestErrorFrom(t *testing.T) {
	r := contracts.RelayNodeNotCarried.Refuse("node-x")
	if e := ErrorFrom(r); e.Text != "relay-node-not-carried: node-x" || string(e.Data) != `{"code":"relay-node-not-carried"}` {
		t.Fatalf("refusal: %+v", e)
	}
	pr, _ := contracts.NegotiateProtocol(contracts.RelayOffer, contracts.ProtocolOffer{InterfacesVersion: "33.0.0", MinimumPeerVersion: "33.0.0"})
	if e := ErrorFrom(pr); !strings.HasPrefix(e.Text, "protocol-incompatible: major-mismatch") {
		t.Fatalf("protocol refusal: %+v", e)
	} else if _, ok := contracts.ReadProtocolRefusal(e.Data); !ok {
		t.Fatalf("protocol refusal data unreadable: %s", e.Data)
	}
	remote := &Error{Text: "anything", Data: []byte(`{"k":1}`)}
	if ErrorFrom(remote) != remote {
		t.Fatal("a remote error is not passed through untouched")
	}
	if e := ErrorFrom(errors.New("open /secret/path: bearer abc")); strings.Contains(e.Text, "bearer") {
		t.Fatalf("a local error's text leaked: %q", e.Text)
	}
}

// Decode runs on the read loop for every frame any peer sends, a registered node's up to the
// registered message limit (8 MiB) and an anonymous one's up to 64 KiB. An answer whose error
// object carries many unknown keys is read (they are ignored), and reading it must not cost
// members² key comparisons: 100 000 keys, under 1 MB, took tens of seconds of one core, and the
// read loop answered nothing meanwhile. BenchmarkDecodeErrorManyKeys measures the cost per key at
// two sizes 16 times apart (about equal when linear); the test checks the answer.

func manyKeysError(n int) []byte {
	frame := []byte(`{"method":"m","request":{},"response":null,"correlation":{"id":"x","phase":"response"},"error":{"text":"t"`)
	for i := range n {
		frame = append(frame, `,"`...)
		frame = strconv.AppendInt(frame, int64(i), 36)
		frame = append(frame, `":0`...)
	}
	return append(frame, "}}"...)
}

// TestDecodeErrorWithManyKeys: an error object's unknown keys are ignored, however many.
func TestDecodeErrorWithManyKeys(t *testing.T) {
	for _, n := range []int{4_000, 64_000} {
		env, err := Decode(manyKeysError(n))
		if err != nil || env.Error == nil || env.Error.Text != "t" {
			t.Fatalf("an error object with %d unknown keys: %v", n, err)
		}
	}
}

func BenchmarkDecodeErrorManyKeys(b *testing.B) {
	for _, n := range []int{4_000, 64_000} {
		frame := manyKeysError(n)
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(len(frame)))
			for b.Loop() {
				if _, err := Decode(frame); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/key")
		})
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"method":"m","request":{"n":12345678901234567890},"response":null,"correlation":{"id":"1","phase":"request"}}`,
		`{"method":"m","request":{},"response":{"x":"<&>"},"correlation":{"id":"abc","phase":"response"}}`,
		`{"method":"m","response":null,"correlation":{"id":"1","phase":"response"},"error":{"text":"relay-node-busy: x","data":null},"retry":{"waitForMs":1}}`,
		`{"method":"m","request":[],"correlation":{"id":"1","phase":"request"}}`,
		`{}`, `garbage`,
		`{"method":"##VirtualStream##","request":{"streamId":"s","cycleId":"c","cycle":"request","mainPurpose":"chunk","chunkData":"#############CLOSING BIT#############"},"response":null}`,
		`{"method":"m","request":{},"correlation":{"id":"1","phase":"response"},"error":{"text":"no data"}}`,
		`{"method":"has space","request":{},"response":null,"correlation":{"id":"1","phase":"request"},"localData":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		env, err := Decode(frame)
		if err != nil || env.IsStream() { // stream frames are forwarded whole, never re-encoded
			return
		}
		if env.Phase == PhaseResponse && env.Error == nil && env.Response == nil {
			env.Response = json.RawMessage("null") // no body is sent as null
		}
		out := env.Append(nil)
		back, err := Decode(out)
		if err != nil {
			t.Fatalf("re-encoded envelope unreadable: %q -> %q: %v", frame, out, err)
		}
		if back.Method != env.Method || back.ID != env.ID || back.Phase != env.Phase ||
			string(back.Request) != string(env.Request) && env.Phase == PhaseRequest ||
			string(back.Response) != string(env.Response) || string(back.Retry) != string(env.Retry) ||
			(env.Error == nil) != (back.Error == nil) ||
			env.Error != nil && (back.Error.Text != env.Error.Text || string(back.Error.Data) != string(env.Error.Data)) {
			t.Fatalf("round trip changed the envelope:\n%q\n%q", frame, out)
		}
	})
}
