package sim

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// dialCloudly opens a socket to the sim Cloudly as a relay would, without the relay.
func dialCloudly(t *testing.T, c *Cloudly) *typedsocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, c.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	conn := typedsocket.New(ws, typedsocket.Options{Handler: typedsocket.HandlerFunc(func(_ *typedsocket.Conn, r *typedsocket.Request) {
		r.Respond(json.RawMessage(`{}`))
	}), ReadLimit: 1 << 20, Logger: zerolog.Nop()})
	go conn.Run(context.Background())
	t.Cleanup(func() { conn.CloseNow(); <-conn.Done() })
	return conn
}

func registration(seq int64) json.RawMessage {
	b, _ := json.Marshal(contracts.RegisterClusterRelayRequest{Protocol: contracts.RelayOffer,
		Relay:                contracts.ClusterRelayRegistration{Version: "1.0.0", NodeID: "relay-node", ListenAddress: "192.0.2.1", ListenPort: 8443},
		RegistrationSequence: seq})
	return b
}

func wantText(t *testing.T, err error, prefix string) {
	t.Helper()
	if err == nil || !strings.HasPrefix(err.Error(), prefix) && !strings.Contains(err.Error(), prefix) {
		t.Fatalf("want a refusal %q, got %v", prefix, err)
	}
}

// Cloudly's order on a socket (docs/protocol.md#upstream-session): registerCloudlyClientSession { protocol, jwt } first,
// then registerClusterRelay with a registrationSequence that advances, and only then forwarded
// node traffic. The stand-in used to accept each of these out of order.
func TestSimCloudlyJudgesTheRelaysOrder(t *testing.T) {
	c, err := NewCloudly(zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := dialCloudly(t, c)
	ctx := context.Background()
	node := NewNode("node-a", zerolog.Nop())

	_, err = conn.Call(ctx, contracts.MethodRegisterClusterRelay, registration(0))
	wantText(t, err, "unauthenticated")
	extra := []byte(`{"protocol":` + string(must(contracts.RelayOffer.MarshalJSON())) + `,"jwt":"sim-machine-jwt","clusterId":"cluster-sim"}`)
	_, err = conn.Call(ctx, contracts.MethodRegisterCloudlyClientSession, extra)
	wantText(t, err, "must use its exact schema")
	if _, err := conn.Call(ctx, contracts.MethodRegisterCloudlyClientSession, contracts.EncodeCloudlyClientSessionRequest(contracts.RelayOffer, contracts.NewSecret(c.Token))); err != nil {
		t.Fatal(err)
	}
	_, err = conn.Call(ctx, contracts.MethodRegisterPalletRuntimeSession, node.RegistrationBody())
	wantText(t, err, "relay-not-connected")
	for _, seq := range []int64{0, 1, 3} {
		if _, err := conn.Call(ctx, contracts.MethodRegisterClusterRelay, registration(seq)); err != nil {
			t.Fatalf("sequence %d: %v", seq, err)
		}
	}
	for _, seq := range []int64{3, 2} {
		_, err = conn.Call(ctx, contracts.MethodRegisterClusterRelay, registration(seq))
		wantText(t, err, string(contracts.RelaySequenceNotAdvancing))
	}
	if _, err := conn.Call(ctx, contracts.MethodRegisterPalletRuntimeSession, node.RegistrationBody()); err != nil {
		t.Fatalf("a node registration on the registered socket: %v", err)
	}
	unsorted := strings.Replace(string(node.RegistrationBody()), `["network","secrets","storage"]`, `["storage","network"]`, 1)
	_, err = conn.Call(ctx, contracts.MethodRegisterPalletRuntimeSession, json.RawMessage(unsorted))
	wantText(t, err, "registration-invalid")
	if len(c.Violations()) != 4 {
		t.Fatalf("violations %q", c.Violations())
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// The node answers only what the relay may send it: pushRelayUpstreamChanged exactly
// { attached: boolean }, and Cloudly → node requests that name this node.
func TestSimNodeJudgesTheRelaysPushes(t *testing.T) {
	n := NewNode("node-a", zerolog.Nop())
	if err := n.checkSession(json.RawMessage(`{"session":{"nodeId":"node-b"}}`)); err == nil {
		t.Fatal("the node answered a request for node-b")
	}
	if err := n.checkSession(json.RawMessage(`{"session":{"nodeId":"node-a"}}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := n.bindRegistration(json.RawMessage(`{"session":{"nodeId":"node-b","controller":{},"runtimeNamespace":"rt"},"protocol":` +
		string(must(contracts.RelayOffer.MarshalJSON())) + `}`)); err == nil {
		t.Fatal("the node took another node's session binding")
	}
}

// The stand-in reads the relay registration exact-key, as the seed's validator does (docs/protocol.md#upstream-session step
// 2): a registration carrying any member the seed does not spell is refused and recorded as a
// violation. It learns the hub from registerClusterVpnHub alone, and only from the attached relay.
func TestSimCloudlyJudgesTheRegistrationExactlyAndLearnsTheHubFromItsOwnCall(t *testing.T) {
	c, err := NewCloudly(zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := dialCloudly(t, c)
	ctx := context.Background()
	if _, err := conn.Call(ctx, contracts.MethodRegisterCloudlyClientSession, contracts.EncodeCloudlyClientSessionRequest(contracts.RelayOffer, contracts.NewSecret(c.Token))); err != nil {
		t.Fatal(err)
	}
	key := [32]byte{7}
	report := contracts.EncodeRegisterClusterVpnHubRequest(contracts.ClusterVpnHubReport{
		Hub: contracts.RuntimeNetworkVpnHub{ClusterID: c.ClusterID, Address: "192.0.2.1", QUICPort: 4433}, NoisePublicKey: key})
	_, err = conn.Call(ctx, contracts.MethodRegisterClusterVpnHub, report)
	wantText(t, err, "relay-not-connected")

	withHub := strings.Replace(string(registration(0)), `"listenPort":8443}`, `"listenPort":8443,"vpnHub":null}`, 1)
	_, err = conn.Call(ctx, contracts.MethodRegisterClusterRelay, json.RawMessage(withHub))
	if !errors.Is(err, contracts.RelayRequestInvalid) {
		t.Fatalf("a registration with relay.vpnHub: %v, want %s", err, contracts.RelayRequestInvalid)
	}
	if c.Registrations() != 0 || c.Attached() {
		t.Fatal("a registration the seed's validator refuses attached the relay")
	}
	if _, err := conn.Call(ctx, contracts.MethodRegisterClusterRelay, registration(0)); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.VPNHub(); ok {
		t.Fatal("the stand-in knows a hub before any report")
	}
	foreign := strings.Replace(string(report), `"`+c.ClusterID+`"`, `"cluster-other"`, 1)
	_, err = conn.Call(ctx, contracts.MethodRegisterClusterVpnHub, json.RawMessage(foreign))
	if !errors.Is(err, contracts.RelayRequestInvalid) {
		t.Fatalf("a hub of another cluster: %v", err)
	}
	if ans, err := conn.Call(ctx, contracts.MethodRegisterClusterVpnHub, report); err != nil || string(ans) != `{}` {
		t.Fatalf("hub report answered %s, %v", ans, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	hub, err := c.WaitVPNHub(wctx)
	if err != nil || hub.Hub.Address != "192.0.2.1" || hub.Hub.QUICPort != 4433 || hub.NoisePublicKey != key {
		t.Fatalf("learned hub %+v, %v", hub, err)
	}
	// The unauthenticated report, the vpnHub registration and the foreign hub.
	if v := c.Violations(); len(v) != 3 || !strings.Contains(v[1], "relay must use its exact schema") {
		t.Fatalf("violations %q", v)
	}
}
