package relay_test

import (
	"encoding/json"
	"testing"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/relay"
)

// The relay calls Cloudly itself only for registerCloudlyClientSession, registerClusterRelay and
// getClusterRouteTable (SPEC §5); on the relay's socket Cloudly answers them as the relay's own.
// A node that sends one must be refused, never forwarded: getClusterRouteTable would hand a node
// the route table with every ingress certificate and private key (SPEC §8 keeps it to the accepted
// ingress, relay-ingress-only), and registerClusterRelay would let a node re-register the relay
// with its own listen address, VPN hub key and registrationSequence (SPEC §4).
func TestNodeCannotCallTheRelaysOwnCloudlyMethods(t *testing.T) {
	e := start(t, relay.Features{})
	const secret = `{"table":{"revision":7,"certificates":[{"privateKey":"-----BEGIN PRIVATE KEY-----"}]}}`
	e.cloudly.Handle(contracts.MethodGetClusterRouteTable, func(json.RawMessage) (json.RawMessage, error) {
		return json.RawMessage(secret), nil
	})
	n := e.node("node-a")
	before := map[string]int{}
	methods := []string{contracts.MethodGetClusterRouteTable, contracts.MethodRegisterClusterRelay, contracts.MethodRegisterCloudlyClientSession}
	for _, m := range methods {
		before[m] = e.cloudly.Received(m)
	}
	// A registration Cloudly would accept: the relay's own, from another address, a sequence ahead.
	var hijack contracts.RegisterClusterRelayRequest
	if err := json.Unmarshal(e.cloudly.Last(contracts.MethodRegisterClusterRelay), &hijack); err != nil {
		t.Fatal(err)
	}
	hijack.Relay.ListenAddress, hijack.RegistrationSequence = "198.51.100.66", 1000
	bodies := map[string]json.RawMessage{
		contracts.MethodGetClusterRouteTable:         json.RawMessage(`{}`),
		contracts.MethodRegisterClusterRelay:         mustJSON(hijack),
		contracts.MethodRegisterCloudlyClientSession: contracts.EncodeCloudlyClientSessionRequest(contracts.RelayOffer, contracts.NewSecret(e.cloudly.Token)),
	}
	// The seed's relay → Cloudly rows, and the relay's own push to its peers, are the relay's too.
	for _, m := range []string{contracts.MethodGetClusterPlatformDesiredState, contracts.MethodBackupServiceDatabaseClosure,
		contracts.MethodRestoreServiceDatabaseClosure, contracts.MethodBeginSecretRecipientEnrollment,
		contracts.MethodCompleteSecretRecipientEnrollment, contracts.MethodPushRelayUpstreamChanged} {
		methods = append(methods, m)
		before[m] = e.cloudly.Received(m)
		bodies[m] = json.RawMessage(`{"session":{"nodeId":"node-a"},"nodeId":"node-a"}`)
	}
	for _, m := range methods {
		got, err := n.Call(ctx5(t), m, bodies[m])
		if err == nil {
			t.Errorf("node's %s was forwarded and answered by Cloudly as the relay's own: %s", m, got)
			continue
		}
		wantRefusal(t, err, contracts.RelayMethodUnknown)
	}
	for _, m := range methods {
		if got := e.cloudly.Received(m); got != before[m] {
			t.Errorf("Cloudly received %s from a node through the relay's session (%d → %d)", m, before[m], got)
		}
	}
}
