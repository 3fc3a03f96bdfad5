package contracts

import (
	"errors"
	"testing"
)

func TestReadRegisterPalletRuntimeSessionResponse(t *testing.T) {
	session := `{"nodeId":"-node-a","controller":{"kind":"cloudly","id":"c-1"},"runtimeNamespace":"rt-1","epoch":3}`
	s, err := ReadRegisterPalletRuntimeSessionResponse([]byte(`{"session": ` + session + ` ,"protocol":{}}`))
	if err != nil || s.NodeID != "-node-a" || string(s.Controller) != `{"kind":"cloudly","id":"c-1"}` || s.RuntimeNamespace != "rt-1" ||
		string(s.Raw) != session {
		t.Fatalf("%+v %v", s, err)
	}
	// IRuntimeSessionBinding is spelled only in part by the seeds: the relay needs nodeId to bind
	// the connection; controller and runtimeNamespace only scope escrowed runs, so a binding
	// without them (or with values of another kind) still carries the node, and members the relay
	// does not know stay opaque.
	t.Run("only nodeId is required; unknown members are kept opaque", func(t *testing.T) {
		for _, session := range []string{
			`{"nodeId":"node-a"}`,
			`{"nodeId":"node-a","controller":"cloudly","runtimeNamespace":"-not canonical-","sessionId":"s-9","fence":{"epoch":4}}`,
			`{"clusterId":"c","nodeId":"node-a","controller":null}`,
		} {
			s, err := ReadRegisterPalletRuntimeSessionResponse([]byte(`{"session":` + session + `}`))
			if err != nil || s.NodeID != "node-a" || s.Controller != nil || s.RuntimeNamespace != "" || string(s.Raw) != session {
				t.Errorf("%s: %+v %v", session, s, err)
			}
		}
		// A run can then never be in that session's scope.
		h := HoldRuntimeNetworkDnsLeaseRenewalsRequest{NodeID: "node-a", Renewals: []SignedRuntimeNetworkDnsLeaseRenewal{{
			Renewal: RuntimeNetworkDnsLeaseRenewal{Controller: []byte(`{}`), NodeID: "node-a", RuntimeNamespace: "rt-1"}}}}
		if len(h.ScopeReasons(RuntimeSession{NodeID: "node-a"})) == 0 {
			t.Error("a run is in the scope of a session that states no controller or namespace")
		}
	})
	for _, body := range []string{`{}`, `{"session":"s"}`, `{"session":{"controller":{}}}`, `{"session":{"nodeId":"a b"}}`,
		`{"session":{"nodeId":"a","nodeId":"b"}}`, `{"session":{},"session":{}}`} {
		var inv *InvalidError
		if _, err := ReadRegisterPalletRuntimeSessionResponse([]byte(body)); !errors.As(err, &inv) {
			t.Errorf("%s: %v, want an invalid answer", body, err)
		}
	}
}
