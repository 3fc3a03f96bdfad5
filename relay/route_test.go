package relay_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/await"
)

// The body of both directions' byte-identity checks: a 20-digit integer, "<&>" and U+2028 both
// escaped and raw, key order that is not sorted, an exponent and a trailing zero.
const weirdBody = `{"session":{"nodeId":"node-a","epoch":1},"n":12345678901234567890,` +
	`"escaped":"<&>\u2028","raw":"<&>` + "\u2028" + `","z":1.50,"a":1E+2,"nested":{"b":[true,null],"a":-0}}`

func wantRefusalText(t *testing.T, err error, prefix string) *typedsocket.Error {
	t.Helper()
	var e *typedsocket.Error
	if !errors.As(err, &e) || !strings.HasPrefix(e.Text, prefix) {
		t.Fatalf("err = %v, want text starting %q", err, prefix)
	}
	return e
}

// TestForwarding: requests between nodes and Cloudly (docs/protocol.md#framing-typedrequest-over-websocket and docs/protocol.md#node-runtime-sessions): untouched, or refused by name.
func TestForwarding(t *testing.T) {
	t.Run("bodies are forwarded byte-identical", func(t *testing.T) {
		e := start(t, relay.Features{})
		const answer = `{"status":"accepted","n":98765432109876543210,"s":"\u003c` + "\u2028" + `"}`
		e.cloudly.Handle("reportRuntimeAssignmentObservation", func(json.RawMessage) (json.RawMessage, error) {
			return json.RawMessage(answer), nil
		})
		n := e.node("node-a")
		got, err := n.Call(ctxHung(t), "reportRuntimeAssignmentObservation", json.RawMessage(weirdBody))
		if err != nil {
			t.Fatal(err)
		}
		if string(e.cloudly.Last("reportRuntimeAssignmentObservation")) != weirdBody {
			t.Fatalf("node → Cloudly body changed:\n got %s\nwant %s", e.cloudly.Last("reportRuntimeAssignmentObservation"), weirdBody)
		}
		if string(got) != answer {
			t.Fatalf("Cloudly's answer changed:\n got %s\nwant %s", got, answer)
		}

		n.Handle("readRuntimeAssignmentStats", func(json.RawMessage) (json.RawMessage, error) { return json.RawMessage(answer), nil })
		got, err = e.cloudly.Call(ctxHung(t), "readRuntimeAssignmentStats", json.RawMessage(weirdBody))
		if err != nil {
			t.Fatal(err)
		}
		if string(n.Last("readRuntimeAssignmentStats")) != weirdBody {
			t.Fatalf("Cloudly → node body changed:\n got %s\nwant %s", n.Last("readRuntimeAssignmentStats"), weirdBody)
		}
		if string(got) != answer {
			t.Fatalf("the node's answer changed:\n got %s\nwant %s", got, answer)
		}
	})

	t.Run("errors are forwarded untouched", func(t *testing.T) {
		e := start(t, relay.Features{})
		const data = `{"code":"assignment-conflict","n":12345678901234567890,"s":"<&>` + "\u2028" + `"}`
		e.cloudly.Handle("reportRuntimeAssignmentTerminalReceipt", func(json.RawMessage) (json.RawMessage, error) {
			return nil, &typedsocket.Error{Text: "assignment-conflict: receipt sequence 3 is not next", Data: json.RawMessage(data)}
		})
		n := e.node("node-a")
		_, err := n.Call(ctxHung(t), "reportRuntimeAssignmentTerminalReceipt", json.RawMessage(`{"session":{"nodeId":"node-a"}}`))
		var remote *typedsocket.Error
		if !errors.As(err, &remote) || remote.Text != "assignment-conflict: receipt sequence 3 is not next" || string(remote.Data) != data {
			t.Fatalf("Cloudly's error changed on the way: %#v", err)
		}
		n.Handle("applyRuntimeAssignment", func(json.RawMessage) (json.RawMessage, error) {
			return nil, &typedsocket.Error{Text: "node says no", Data: json.RawMessage(data)}
		})
		_, err = e.cloudly.Call(ctxHung(t), "applyRuntimeAssignment", json.RawMessage(`{"session":{"nodeId":"node-a"}}`))
		if !errors.As(err, &remote) || remote.Text != "node says no" || string(remote.Data) != data {
			t.Fatalf("the node's error changed on the way: %#v", err)
		}
	})

	t.Run("what the relay cannot route is refused by name", func(t *testing.T) {
		e := start(t, relay.Features{})
		a := e.node("node-a")
		e.node("-node-b") // a leading '-' is a valid node id
		ctx := ctxHung(t)

		_, err := e.cloudly.Call(ctx, "applyRuntimeAssignment", json.RawMessage(`{"session":{"nodeId":"node-zz"}}`))
		if r := wantRefusal(t, err, contracts.RelayNodeNotCarried); r.Text != "relay-node-not-carried: node-zz" {
			t.Fatalf("text = %q", r.Text)
		}
		_, err = e.cloudly.Call(ctx, "applyRuntimeAssignment", json.RawMessage(`{"assignment":{}}`))
		wantRefusal(t, err, contracts.RelayRequestInvalid)
		// request.nodeId routes too, and reaches the node with a leading '-'.
		if _, err := e.cloudly.Call(ctx, "readRuntimeAssignmentStats", json.RawMessage(`{"nodeId":"-node-b"}`)); err != nil {
			t.Fatalf("routing by request.nodeId: %v", err)
		}
		_, err = a.Call(ctx, "reportRuntimeAssignmentObservation", json.RawMessage(`{"session":{"nodeId":"-node-b"}}`))
		wantRefusal(t, err, contracts.RelaySessionForeign)
		_, err = a.Call(ctx, "reportRuntimeAssignmentObservation", json.RawMessage(`{"session":"node-a"}`))
		wantRefusal(t, err, contracts.RelayRequestInvalid)

		stranger := newNode(t, e, "node-c")
		_, err = stranger.Call(ctx, "getRuntimeRegistryCredential", json.RawMessage(`{"session":{"nodeId":"node-c"}}`))
		wantRefusal(t, err, contracts.RelaySessionForeign)

		for _, m := range []string{"openRuntimeAssignmentExec", "resizeRuntimeAssignmentExec", "closeRuntimeAssignmentExec",
			"readRuntimeLocalVolumeArchive", "writeRuntimeLocalVolumeArchive", "bindPalletLocalRuntimeController"} {
			_, err = a.Call(ctx, m, json.RawMessage(`{"session":{"nodeId":"node-a"}}`))
			wantRefusal(t, err, contracts.RelayMethodLocalOnly)
			_, err = e.cloudly.Call(ctx, m, json.RawMessage(`{"session":{"nodeId":"node-a"}}`))
			wantRefusal(t, err, contracts.RelayMethodLocalOnly)
		}
		if a.Received("openRuntimeAssignmentExec") != 0 || e.cloudly.Received("openRuntimeAssignmentExec") != 0 {
			t.Fatal("a local-only method crossed the relay")
		}
		_, err = a.Call(ctx, contracts.MethodPushClusterRelayConfig, json.RawMessage(`{}`))
		wantRefusal(t, err, contracts.RelayMethodUnknown)
		_, err = e.cloudly.Call(ctx, contracts.MethodPushClusterVpnMembership, json.RawMessage(`{}`))
		wantRefusal(t, err, contracts.RelayVPNHubOff)
		_, err = e.cloudly.Call(ctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, json.RawMessage(`{}`))
		wantRefusal(t, err, contracts.RelayMethodUnknown) // escrow off in this relay
	})

	// The relay calls Cloudly itself only for registerCloudlyClientSession, registerClusterRelay,
	// registerClusterVpnHub and getClusterRouteTable (docs/protocol.md#upstream-session and docs/protocol.md#node-runtime-sessions); on the relay's socket Cloudly
	// answers them as the relay's own.
	// A node that sends one must be refused, never forwarded: getClusterRouteTable would hand a node
	// the route table with every ingress certificate and private key (docs/protocol.md#cluster-ingress keeps it to the accepted
	// ingress, relay-ingress-only), and registerClusterRelay would let a node re-register the relay
	// with its own listen address and registrationSequence, registerClusterVpnHub name the node as
	// the cluster's hub (docs/protocol.md#upstream-session).
	t.Run("a node cannot call the relay's own Cloudly methods", func(t *testing.T) {
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
		// A hub report Cloudly would take: a node naming its own address as the cluster's hub.
		methods = append(methods, contracts.MethodRegisterClusterVpnHub)
		before[contracts.MethodRegisterClusterVpnHub] = e.cloudly.Received(contracts.MethodRegisterClusterVpnHub)
		bodies[contracts.MethodRegisterClusterVpnHub] = contracts.EncodeRegisterClusterVpnHubRequest(contracts.ClusterVpnHubReport{
			Hub: contracts.RuntimeNetworkVpnHub{ClusterID: e.cloudly.ClusterID, Address: "198.51.100.66", QUICPort: 4433}})
		// The seed's relay → Cloudly rows, and the relay's own push to its peers, are the relay's too.
		for _, m := range []string{contracts.MethodGetClusterPlatformDesiredState, contracts.MethodBackupServiceDatabaseClosure,
			contracts.MethodRestoreServiceDatabaseClosure, contracts.MethodBeginSecretRecipientEnrollment,
			contracts.MethodCompleteSecretRecipientEnrollment, contracts.MethodPushRelayUpstreamChanged} {
			methods = append(methods, m)
			before[m] = e.cloudly.Received(m)
			bodies[m] = json.RawMessage(`{"session":{"nodeId":"node-a"},"nodeId":"node-a"}`)
		}
		for _, m := range methods {
			got, err := n.Call(ctxHung(t), m, bodies[m])
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
	})

	t.Run("detached, the relay refuses at once and keeps the sockets", func(t *testing.T) {
		e := start(t, relay.Features{})
		n := e.node("node-a")
		e.cloudly.SetAvailable(false)
		e.eventually("detached", func() bool { return !e.relay.Upstream().Attached() })
		_, err := n.Call(ctxHung(t), "reportRuntimeAssignmentLogs", json.RawMessage(`{"session":{"nodeId":"node-a"}}`))
		wantRefusal(t, err, contracts.RelayUpstreamDetached)
		select {
		case <-n.Conn().Done():
			t.Fatal("the node's socket was dropped because Cloudly was")
		default:
		}
		e.cloudly.SetAvailable(true)
		e.waitAttached()
		// The push, and the node's registration it prompts. Whatever else an attach sends Cloudly
		// is another test's subject, so the registrations are counted from below.
		var pushes, regs int
		if !await.Within(time.Minute, func() bool {
			pushes, regs = n.Received(contracts.MethodPushRelayUpstreamChanged), e.cloudly.NodeRegistrations("node-a")
			return pushes >= 1 && regs >= 2
		}) {
			t.Fatalf("after re-attaching, within a minute: %d pushRelayUpstreamChanged (want 1), node-a registered %d times at Cloudly (want at least 2)",
				pushes, regs)
		}
		if pushes > 1 {
			t.Errorf("one re-attach, %d pushRelayUpstreamChanged", pushes)
		}
		if string(n.Last(contracts.MethodPushRelayUpstreamChanged)) != `{"attached":true}` {
			t.Fatalf("pushRelayUpstreamChanged body = %s", n.Last(contracts.MethodPushRelayUpstreamChanged))
		}
		if _, err := n.Report(ctxHung(t), "reportRuntimeAssignmentObservation", nil); err != nil {
			t.Fatalf("after re-attaching: %v", err)
		}
	})

	t.Run("bearers and bodies never reach the log", func(t *testing.T) {
		e := start(t, relay.Features{})
		n := e.node("node-a")
		if _, err := n.Call(ctxHung(t), "getRuntimeManagedVpnCredential", json.RawMessage(`{"session":{"nodeId":"node-a"},"secretMarker":"sekrit-value"}`)); err != nil {
			t.Fatal(err)
		}
		logs := e.logs.String()
		for _, secret := range []string{"bearer-node-a", "sekrit-value", e.cloudly.Token} {
			if strings.Contains(logs, secret) {
				t.Fatalf("%q reached the log", secret)
			}
		}
		if !strings.Contains(logs, `"method":"getRuntimeManagedVpnCredential"`) || !strings.Contains(logs, `"node":"node-a"`) {
			t.Fatal("the forward was not logged by method and node")
		}
	})
}
