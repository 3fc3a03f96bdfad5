package relay_test

import (
	"encoding/json"
	"testing"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/ingress"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// TestSessionOnlyWhereTheSeedsRequireIt: a node's request needs its session only where the
// interfaces readme requires one ("Every request carries `session`" for logs and stats; "carries
// the exact current session" for the managed VPN credential). A protection report or an
// observation is the connection's ("uses the current authenticated physical peer"), forwarded
// without one. Wherever a session is carried it must be the connection's own node's. Cloudly
// (sim) judges as one built from the seeds would, and records anything the relay forwards that it
// should have refused.
func TestSessionOnlyWhereTheSeedsRequireIt(t *testing.T) {
	e := start(t, relay.Features{})
	n := e.node("node-a")
	e.node("node-b") // a node Cloudly knows: its session is a real one, on another connection
	forwarded := []struct{ method, body string }{
		{"reportRuntimeNetworkProtection", `{"receipt":{"sequence":1}}`},
		{"reportRuntimeAssignmentObservation", `{"observation":{"sequence":1}}`},
		{"reportRuntimeAssignmentTerminalReceipt", `{"receipt":{}}`},
		{"getRuntimeRegistryCredential", `{"assignment":{}}`},
		{"reportRuntimeAssignmentLogs", `{"session":{"nodeId":"node-a"},"batch":{}}`},
		{"getRuntimeManagedVpnCredential", `{"session":{"nodeId":"node-a"},"projection":{}}`},
	}
	for _, c := range forwarded {
		t.Run(c.method+" "+c.body+" is forwarded", func(t *testing.T) {
			if _, err := n.Call(ctxHung(t), c.method, json.RawMessage(c.body)); err != nil {
				t.Fatalf("refused: %v", err)
			}
			if got := string(e.cloudly.Last(c.method)); got != c.body {
				t.Fatalf("Cloudly got %s, want %s", got, c.body)
			}
		})
	}
	refused := []struct {
		method, body string
		name         contracts.RefusalName
	}{
		{"reportRuntimeAssignmentLogs", `{"batch":{}}`, contracts.RelaySessionForeign},
		{"getRuntimeManagedVpnCredential", `{"projection":{}}`, contracts.RelaySessionForeign},
		{"readRuntimeAssignmentStats", `{"assignment":{}}`, contracts.RelaySessionForeign},
		{"getRuntimeManagedVpnCredential", `{"session":{"controller":{}},"projection":{}}`, contracts.RelaySessionForeign},
		{"reportRuntimeAssignmentObservation", `{"session":{"nodeId":"node-b"},"observation":{}}`, contracts.RelaySessionForeign},
		{"reportRuntimeNetworkProtection", `{"session":{"nodeId":"node-b"}}`, contracts.RelaySessionForeign},
		{"reportRuntimeAssignmentLogs", `{"session":{"nodeId":"node-b"},"batch":{}}`, contracts.RelaySessionForeign},
		{"reportRuntimeAssignmentObservation", `{"session":"node-a"}`, contracts.RelayRequestInvalid},
		{"reportRuntimeAssignmentObservation", `{"session":{"nodeId":"node-a"},"session":{"nodeId":"node-b"}}`, contracts.RelayRequestInvalid},
	}
	for _, c := range refused {
		t.Run(c.method+" "+c.body+" is refused "+string(c.name), func(t *testing.T) {
			before := e.cloudly.Received(c.method)
			_, err := n.Call(ctxHung(t), c.method, json.RawMessage(c.body))
			wantRefusal(t, err, c.name)
			if e.cloudly.Received(c.method) != before {
				t.Fatalf("Cloudly received the refused %s", c.method)
			}
		})
	}
}

// TestRelayNodeIDStatesTheConnectionsNode: every node request the relay forwards states, in the
// envelope's relayNodeId, the node of the connection it came on — whatever relayNodeId the node
// wrote itself, escaped or not — and nothing else the relay sends Cloudly states one: not its own
// calls, not the ingress's registration, not a node's stream frame. Cloudly (sim) asserts that the
// relayNodeId of each request is the node whose registration it accepted and the node its session
// names, and records a violation otherwise.
func TestRelayNodeIDStatesTheConnectionsNode(t *testing.T) {
	var ic *sim.IngressControl
	x := relaytest.Start(t, relaytest.Options{
		Cloudly: func(c *sim.Cloudly) { ic = sim.ServeIngress(c) },
		Build: func(cfg relay.Config, o relay.Options) (*relay.Relay, error) {
			in, err := ingress.New(ingress.Options{Logger: o.Logger, Registerer: o.Registry})
			if err != nil {
				return nil, err
			}
			return relay.New(cfg, relay.Features{Parts: []relay.Part{{Name: "ingress", Impl: in}}}, o)
		},
	})
	e := &env{Env: x, t: t, cloudly: x.Cloudly, relay: x.Relay, cfg: x.Config, logs: x.Logs, url: x.URL}
	e.node("node-b")
	raw := dialRaw(t, e, "node-raw")
	if got := e.cloudly.LastRelayNode(contracts.MethodRegisterPalletRuntimeSession); got != "" {
		t.Fatalf("a first node registration stated relayNodeId %q: the connection carried no node yet", got)
	}
	for _, c := range []struct{ name, member string }{
		{"none", ``},
		{"another node's", `"relayNodeId":"node-b",`},
		{"another node's, escaped", `"relay\u004eodeId":"node-b",`},
		{"not a string", `"relayNodeId":{"nodeId":"node-b"},`},
		{"twice", `"relayNodeId":"node-b","relayNodeId":"node-b",`},
	} {
		t.Run("a node's request with "+c.name+" states its own connection's node", func(t *testing.T) {
			raw.write(`{"method":"reportRuntimeAssignmentObservation",` + c.member + `"request":{"observation":{}},"response":null,` +
				`"correlation":{"id":"o","phase":"request"}}`)
			if env := raw.read(); env.Error != nil {
				t.Fatalf("refused: %s", env.Error.Text)
			}
			if got := e.cloudly.LastRelayNode("reportRuntimeAssignmentObservation"); got != "node-raw" {
				t.Fatalf("Cloudly saw relayNodeId %q, want node-raw", got)
			}
		})
	}
	t.Run("a node rotating on its connection states that connection's node", func(t *testing.T) {
		n := e.node("node-c")
		if _, err := n.Register(ctxHung(t)); err != nil {
			t.Fatal(err)
		}
		if got := e.cloudly.LastRelayNode(contracts.MethodRegisterPalletRuntimeSession); got != "node-c" {
			t.Fatalf("a rotation stated relayNodeId %q, want node-c", got)
		}
	})
	t.Run("a node's stream frame reaches Cloudly without the relayNodeId it wrote", func(t *testing.T) {
		frames := make(chan []byte, 4)
		e.cloudly.TapStreams(func(f []byte) { frames <- append([]byte(nil), f...) })
		defer e.cloudly.TapStreams(nil)
		if env := raw.call("s", "reportRuntimeAssignmentObservation", `{"s":{"_isVirtualStream":true,"streamId":"raw-1"}}`); env.Error != nil {
			t.Fatal(env.Error.Text)
		}
		raw.write(`{"method":"##VirtualStream##","relayNodeId":"node-b","request":{"streamId":"raw-1","cycleId":"c1","cycle":"request","mainPurpose":"keepAlive"},"response":null}`)
		got := <-frames
		const want = `{"method":"##VirtualStream##","request":{"streamId":"raw-1","cycleId":"c1","cycle":"request","mainPurpose":"keepAlive"},"response":null}`
		if string(got) != want {
			t.Fatalf("Cloudly got the frame\n%s\nwant\n%s", got, want)
		}
	})
	t.Run("the ingress's registration and the relay's own calls state none", func(t *testing.T) {
		ic.Designate("node-i", "bearer-i")
		in := sim.NewIngress("node-i", "bearer-i", zerolog.Nop())
		if err := in.Connect(ctxHung(t), e.url); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(in.Close)
		if _, err := in.Register(ctxHung(t)); err != nil {
			t.Fatal(err)
		}
		for _, m := range []string{contracts.MethodRegisterClusterIngress, contracts.MethodRegisterClusterRelay,
			contracts.MethodRegisterCloudlyClientSession, contracts.MethodGetClusterRouteTable} {
			if e.cloudly.Received(m) == 0 {
				t.Fatalf("Cloudly received no %s", m)
			}
			if got := e.cloudly.LastRelayNode(m); got != "" {
				t.Fatalf("%s stated relayNodeId %q", m, got)
			}
		}
	})
	if v := e.cloudly.Violations(); len(v) > 0 {
		t.Fatalf("Cloudly judged the relay: %q", v)
	}
}
