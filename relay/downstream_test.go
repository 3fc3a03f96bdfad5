package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
)

// The body of both directions' byte-identity checks: a 20-digit integer, "<&>" and U+2028 both
// escaped and raw, key order that is not sorted, an exponent and a trailing zero.
const weirdBody = `{"session":{"nodeId":"node-a","epoch":1},"n":12345678901234567890,` +
	`"escaped":"<&>\u2028","raw":"<&>` + "\u2028" + `","z":1.50,"a":1E+2,"nested":{"b":[true,null],"a":-0}}`

func TestNodeOfferOfAnotherMajorIsRefusedWithoutAskingCloudly(t *testing.T) {
	e := start(t, relay.Features{})
	n := newNode(t, e, "node-a")
	n.Offer = contracts.ProtocolOffer{InterfacesVersion: "33.0.0", MinimumPeerVersion: "33.0.0"}
	_, err := n.Register(ctx5(t))
	remote := wantRefusalText(t, err, "protocol-incompatible: major-mismatch: ")
	refusal, ok := contracts.ReadProtocolRefusal(remote.Data)
	if !ok || refusal.Reason != contracts.MajorMismatch || refusal.Refusing != contracts.RelayOffer || refusal.Refused != n.Offer {
		t.Fatalf("refusal data = %s", remote.Data)
	}
	n.Offer = contracts.ProtocolOffer{InterfacesVersion: "32.36.0", MinimumPeerVersion: "32.37.0"}
	_, err = n.Register(ctx5(t))
	wantRefusal(t, err, contracts.RelayRequestInvalid) // not an offer: a minimum above its own release
	n.Offer = contracts.ProtocolOffer{InterfacesVersion: "32.40.0", MinimumPeerVersion: "32.37.0"}
	_, err = n.Register(ctx5(t))
	wantRefusalText(t, err, "protocol-incompatible: self-below-peer-minimum: ")
	if got := e.cloudly.Received(contracts.MethodRegisterPalletRuntimeSession); got != 0 {
		t.Fatalf("Cloudly received %d registrations the relay should have refused", got)
	}
	// A refused registration changed nothing: the connection may not forward.
	_, err = n.Call(ctx5(t), "reportRuntimeAssignmentObservation", json.RawMessage(`{}`))
	wantRefusal(t, err, contracts.RelaySessionForeign)
}

func wantRefusalText(t *testing.T, err error, prefix string) *typedsocket.Error {
	t.Helper()
	var e *typedsocket.Error
	if !errors.As(err, &e) || !strings.HasPrefix(e.Text, prefix) {
		t.Fatalf("err = %v, want text starting %q", err, prefix)
	}
	return e
}

func TestBodiesAreForwardedByteIdentical(t *testing.T) {
	e := start(t, relay.Features{})
	const answer = `{"status":"accepted","n":98765432109876543210,"s":"\u003c` + "\u2028" + `"}`
	e.cloudly.Handle("reportRuntimeAssignmentObservation", func(json.RawMessage) (json.RawMessage, error) {
		return json.RawMessage(answer), nil
	})
	n := e.node("node-a")
	got, err := n.Call(ctx5(t), "reportRuntimeAssignmentObservation", json.RawMessage(weirdBody))
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
	got, err = e.cloudly.Call(ctx5(t), "readRuntimeAssignmentStats", json.RawMessage(weirdBody))
	if err != nil {
		t.Fatal(err)
	}
	if string(n.Last("readRuntimeAssignmentStats")) != weirdBody {
		t.Fatalf("Cloudly → node body changed:\n got %s\nwant %s", n.Last("readRuntimeAssignmentStats"), weirdBody)
	}
	if string(got) != answer {
		t.Fatalf("the node's answer changed:\n got %s\nwant %s", got, answer)
	}
}

func TestErrorsAreForwardedUntouched(t *testing.T) {
	e := start(t, relay.Features{})
	const data = `{"code":"assignment-conflict","n":12345678901234567890,"s":"<&>` + "\u2028" + `"}`
	e.cloudly.Handle("reportRuntimeAssignmentTerminalReceipt", func(json.RawMessage) (json.RawMessage, error) {
		return nil, &typedsocket.Error{Text: "assignment-conflict: receipt sequence 3 is not next", Data: json.RawMessage(data)}
	})
	n := e.node("node-a")
	_, err := n.Call(ctx5(t), "reportRuntimeAssignmentTerminalReceipt", json.RawMessage(`{"session":{"nodeId":"node-a"}}`))
	var remote *typedsocket.Error
	if !errors.As(err, &remote) || remote.Text != "assignment-conflict: receipt sequence 3 is not next" || string(remote.Data) != data {
		t.Fatalf("Cloudly's error changed on the way: %#v", err)
	}
	n.Handle("applyRuntimeAssignment", func(json.RawMessage) (json.RawMessage, error) {
		return nil, &typedsocket.Error{Text: "node says no", Data: json.RawMessage(data)}
	})
	_, err = e.cloudly.Call(ctx5(t), "applyRuntimeAssignment", json.RawMessage(`{"session":{"nodeId":"node-a"}}`))
	if !errors.As(err, &remote) || remote.Text != "node says no" || string(remote.Data) != data {
		t.Fatalf("the node's error changed on the way: %#v", err)
	}
}

func TestRoutingRefusals(t *testing.T) {
	e := start(t, relay.Features{})
	a := e.node("node-a")
	e.node("-node-b") // a leading '-' is a valid node id
	ctx := ctx5(t)

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
}

func TestDetachedRefusesAtOnceAndKeepsSockets(t *testing.T) {
	e := start(t, relay.Features{})
	n := e.node("node-a")
	e.cloudly.SetAvailable(false)
	e.eventually("detached", func() bool { return !e.relay.Upstream().Attached() })
	_, err := n.Call(ctx5(t), "reportRuntimeAssignmentLogs", json.RawMessage(`{"session":{"nodeId":"node-a"}}`))
	wantRefusal(t, err, contracts.RelayUpstreamDetached)
	select {
	case <-n.Conn().Done():
		t.Fatal("the node's socket was dropped because Cloudly was")
	default:
	}
	e.cloudly.SetAvailable(true)
	e.waitAttached()
	e.eventually("pushRelayUpstreamChanged and a new registration", func() bool {
		return n.Received(contracts.MethodPushRelayUpstreamChanged) == 1 && e.cloudly.NodeRegistrations("node-a") == 2
	})
	if string(n.Last(contracts.MethodPushRelayUpstreamChanged)) != `{"attached":true}` {
		t.Fatalf("pushRelayUpstreamChanged body = %s", n.Last(contracts.MethodPushRelayUpstreamChanged))
	}
	if _, err := n.Report(ctx5(t), "reportRuntimeAssignmentObservation", nil); err != nil {
		t.Fatalf("after re-attaching: %v", err)
	}
}

func TestSupersededConnectionIsClosed(t *testing.T) {
	e := start(t, relay.Features{})
	first := e.node("node-a")
	other := e.node("node-b")
	second := e.node("node-a")
	select {
	case <-first.Conn().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the superseded connection is still open")
	}
	if code := websocket.CloseStatus(context.Cause(first.Conn().Context())); code != 4001 {
		t.Fatalf("close status %d, want 4001 (%v)", code, context.Cause(first.Conn().Context()))
	}
	if _, err := e.cloudly.Call(ctx5(t), "applyRuntimeAssignment", json.RawMessage(`{"session":{"nodeId":"node-a"}}`)); err != nil {
		t.Fatal(err)
	}
	if second.Received("applyRuntimeAssignment") != 1 {
		t.Fatal("Cloudly's request did not reach the newer connection")
	}
	if _, err := other.Report(ctx5(t), "reportRuntimeAssignmentObservation", nil); err != nil {
		t.Fatalf("another node was disturbed: %v", err)
	}
}

func TestRotationRegistersAgainOnTheSameConnection(t *testing.T) {
	e := start(t, relay.Features{})
	n := e.node("node-a")
	n.Generation++
	resp, err := n.Register(ctx5(t))
	if err != nil {
		t.Fatalf("rotation: %v", err)
	}
	if !strings.Contains(string(resp), `"generation":2`) || e.cloudly.NodeRegistrations("node-a") != 2 {
		t.Fatalf("rotation answer %s", resp)
	}
	select {
	case <-n.Conn().Done():
		t.Fatal("rotation closed the connection")
	default:
	}
	if _, err := n.Report(ctx5(t), "reportRuntimeAssignmentObservation", nil); err != nil {
		t.Fatal(err)
	}
	// One connection carries one node.
	n.ID, n.Bearer = "node-b", "bearer-node-b"
	_, err = n.Register(ctx5(t))
	wantRefusal(t, err, contracts.RelaySessionForeign)
}

func TestBearersAndBodiesNeverReachTheLog(t *testing.T) {
	e := start(t, relay.Features{})
	n := e.node("node-a")
	if _, err := n.Call(ctx5(t), "getRuntimeManagedVpnCredential", json.RawMessage(`{"session":{"nodeId":"node-a"},"secretMarker":"sekrit-value"}`)); err != nil {
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
}
