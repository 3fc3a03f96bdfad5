package typedsocket

import (
	"errors"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/contracts"
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
	noData, err := Decode([]byte(`{"method":"m","response":null,"correlation":{"id":"x","phase":"response"},"error":{"text":"t"}}`))
	if err != nil || string(noData.Error.Data) != "null" {
		t.Fatalf("error without data: %+v %v", noData, err)
	}
}

func TestDecodeRefusals(t *testing.T) {
	cases := []struct {
		frame      string
		answerable bool
	}{
		{`not json`, false},
		{`[]`, false},
		{`{"method":"m","method":"n","request":{},"correlation":{"id":"1","phase":"request"}}`, false},
		{`{"method":"","request":{},"correlation":{"id":"1","phase":"request"}}`, false},
		{`{"method":"has space","request":{},"correlation":{"id":"1","phase":"request"}}`, false},
		{`{"method":"m","request":{},"correlation":{"id":"","phase":"request"}}`, false},
		{`{"method":"m","request":{},"correlation":{"id":"1","phase":"other"}}`, false},
		{`{"method":"m","request":{},"correlation":{"id":"1"}}`, false},
		{`{"method":"m","request":[],"correlation":{"id":"1","phase":"request"}}`, true},
		{`{"method":"m","correlation":{"id":"1","phase":"request"}}`, true},
		{`{"method":"m","response":5,"correlation":{"id":"1","phase":"response"}}`, true},
		{`{"method":"m","response":null,"error":{"text":1},"correlation":{"id":"1","phase":"response"}}`, true},
		{`{"method":"m","response":null,"error":{"text":"t","extra":1},"correlation":{"id":"1","phase":"response"}}`, true},
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

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"method":"m","request":{"n":12345678901234567890},"response":null,"correlation":{"id":"1","phase":"request"}}`,
		`{"method":"m","request":{},"response":{"x":"<&>"},"correlation":{"id":"abc","phase":"response"}}`,
		`{"method":"m","response":null,"correlation":{"id":"1","phase":"response"},"error":{"text":"relay-node-busy: x","data":null},"retry":{"waitForMs":1}}`,
		`{"method":"m","request":[],"correlation":{"id":"1","phase":"request"}}`,
		`{}`, `garbage`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		env, err := Decode(frame)
		if err != nil {
			return
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
