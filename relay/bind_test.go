package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/escrow"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// TestNodeRegistration: registerPalletRuntimeSession through the relay (docs/protocol.md#node-runtime-sessions): judged here,
// forwarded untouched, the connection bound to the session Cloudly answers with.
func TestNodeRegistration(t *testing.T) {
	t.Run("an offer of another major is refused without asking Cloudly", func(t *testing.T) {
		e := start(t, relay.Features{})
		n := newNode(t, e, "node-a")
		n.Offer = contracts.ProtocolOffer{InterfacesVersion: "33.0.0", MinimumPeerVersion: "33.0.0"}
		_, err := n.Register(ctxHung(t))
		remote := wantRefusalText(t, err, "protocol-incompatible: major-mismatch: ")
		refusal, ok := contracts.ReadProtocolRefusal(remote.Data)
		if !ok || refusal.Reason != contracts.MajorMismatch || refusal.Refusing != contracts.RelayOffer || refusal.Refused != n.Offer {
			t.Fatalf("refusal data = %s", remote.Data)
		}
		n.Offer = contracts.ProtocolOffer{InterfacesVersion: "32.36.0", MinimumPeerVersion: "32.37.0"}
		_, err = n.Register(ctxHung(t))
		wantRefusal(t, err, contracts.RelayRequestInvalid) // not an offer: a minimum above its own release
		n.Offer = contracts.ProtocolOffer{InterfacesVersion: "32.40.0", MinimumPeerVersion: "32.37.0"}
		_, err = n.Register(ctxHung(t))
		wantRefusalText(t, err, "protocol-incompatible: self-below-peer-minimum: ")
		if got := e.cloudly.Received(contracts.MethodRegisterPalletRuntimeSession); got != 0 {
			t.Fatalf("Cloudly received %d registrations the relay should have refused", got)
		}
		// A refused registration changed nothing: the connection may not forward.
		_, err = n.Call(ctxHung(t), "reportRuntimeAssignmentObservation", json.RawMessage(`{}`))
		wantRefusal(t, err, contracts.RelaySessionForeign)
	})

	t.Run("a superseded connection is closed", func(t *testing.T) {
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
		if _, err := e.cloudly.Call(ctxHung(t), "applyRuntimeAssignment", json.RawMessage(`{"session":{"nodeId":"node-a"}}`)); err != nil {
			t.Fatal(err)
		}
		if second.Received("applyRuntimeAssignment") != 1 {
			t.Fatal("Cloudly's request did not reach the newer connection")
		}
		if _, err := other.Report(ctxHung(t), "reportRuntimeAssignmentObservation", nil); err != nil {
			t.Fatalf("another node was disturbed: %v", err)
		}
	})

	t.Run("a rotation registers again on the same connection", func(t *testing.T) {
		e := start(t, relay.Features{})
		n := e.node("node-a")
		n.Generation++
		resp, err := n.Register(ctxHung(t))
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
		if _, err := n.Report(ctxHung(t), "reportRuntimeAssignmentObservation", nil); err != nil {
			t.Fatal(err)
		}
		// One connection carries one node.
		n.ID, n.Bearer = "node-b", "bearer-node-b"
		_, err = n.Register(ctxHung(t))
		wantRefusal(t, err, contracts.RelaySessionForeign)
	})

	// A node registration Cloudly accepts after the node's connection has already ended must not bind
	// the node to that dead connection: the node table would keep it for ever, the nodes gauge would
	// count a node nobody carries, and a later (live) connection of the same node would be closed as
	// "superseded" by the dead one.
	t.Run("a late answer does not bind a closed connection", func(t *testing.T) {
		e := start(t, relay.Features{})
		live := e.node("node-a") // the node's current, healthy connection
		e.cloudly.SetSlowness(400 * time.Millisecond)

		n := newNode(t, e, "node-a")
		if _, err := n.Conn().CallAsync(contracts.MethodRegisterPalletRuntimeSession, n.RegistrationBody(), func(typedsocket.Reply) {}); err != nil {
			t.Fatal(err)
		}
		e.eventually("Cloudly received the registration", func() bool {
			return e.cloudly.Received(contracts.MethodRegisterPalletRuntimeSession) == 2
		})
		n.Close() // the connection ends before Cloudly's answer
		e.eventually("the relay saw the connection end", func() bool {
			return e.Metric("relay_downstream_connections") == 1
		})
		e.eventually("Cloudly's late answer reached the relay", func() bool {
			return e.Metric("relay_downstream_registrations_total", "outcome", "accepted") >= 2 ||
				e.Metric("relay_downstream_refusals_total") > 0
		})
		e.cloudly.SetSlowness(0)
		// A round trip on the upstream socket the late answer came by: what the relay did with
		// that answer, it has done by the time this call reaches node-a.
		if _, err := e.cloudly.Call(ctxHung(t), "applyRuntimeAssignment", json.RawMessage(`{"session":{"nodeId":"node-a"}}`)); err != nil {
			t.Fatalf("Cloudly → node-a after the dead connection's late registration: %v", err)
		}

		select {
		case <-live.Conn().Done():
			t.Fatalf("the live connection of node-a was closed (%v) because a dead connection's registration was accepted late",
				context.Cause(live.Conn().Context()))
		default:
		}
		if got := e.Metric("relay_downstream_nodes"); got != 1 {
			t.Errorf("relay_downstream_nodes = %v with one connection carrying node-a", got)
		}
		if _, err := e.cloudly.Call(ctxHung(t), "applyRuntimeAssignment", json.RawMessage(`{"session":{"nodeId":"node-a"}}`)); err != nil {
			t.Fatalf("Cloudly → node-a after the dead connection's late registration: %v", err)
		}
	})

	// The same late answer with no other connection: the relay must not count (or keep in its node
	// table) a node whose only connection is gone.
	t.Run("a late answer leaves no stale node", func(t *testing.T) {
		e := start(t, relay.Features{})
		e.cloudly.SetSlowness(400 * time.Millisecond)
		n := newNode(t, e, "node-a")
		if _, err := n.Conn().CallAsync(contracts.MethodRegisterPalletRuntimeSession, n.RegistrationBody(), func(typedsocket.Reply) {}); err != nil {
			t.Fatal(err)
		}
		e.eventually("Cloudly received the registration", func() bool {
			return e.cloudly.Received(contracts.MethodRegisterPalletRuntimeSession) == 1
		})
		n.Close()
		e.eventually("the relay saw the connection end", func() bool { return e.Metric("relay_downstream_connections") == 0 })
		e.eventually("Cloudly's late answer reached the relay", func() bool {
			return e.Metric("relay_downstream_registrations_total", "outcome", "accepted") >= 1 ||
				e.Metric("relay_downstream_refusals_total") > 0
		})
		if got := e.Metric("relay_downstream_nodes"); got != 0 {
			t.Fatalf("relay_downstream_nodes = %v with no downstream connection at all", got)
		}
	})

	// A node connection that ends while Cloudly's acceptance of its registration is being bound must
	// leave no binding in escrow: escrow-node-not-carried means "no current session of that node on
	// this relay" (docs/escrow.md), and a feature must keep nothing for a connection that is gone. The
	// relay once told escrow NodeBound after NodeGone when the connection ended between the two, so
	// the escrow held runs for, and released them to, a dead connection until the node came back;
	// escrow now follows the connection's end through its context.
	t.Run("a connection ending while it is bound leaves no escrow carrier", func(t *testing.T) {
		esc, err := escrow.New(escrow.Options{})
		if err != nil {
			t.Fatal(err)
		}
		w := &pausingWriter{}
		e := relaytest.Start(t, relaytest.Options{
			Build: func(cfg relay.Config, opts relay.Options) (*relay.Relay, error) {
				opts.Logger = zerolog.New(w)
				return relay.New(cfg, relay.Features{Parts: []relay.Part{{Name: "escrow", Impl: esc}}}, opts)
			},
		})

		// A first connection of node-a gives the session scope a run is built for; it ends cleanly.
		first := e.Node("node-a")
		session := first.Session()
		first.Close()
		e.Eventually("the first connection is carried by no one", func() bool { return e.Metric("relay_downstream_connections") == 0 })

		second := e.Dial("node-a")
		w.pause = func() {
			// The relay has bound the second connection and not yet told escrow: the connection ends
			// now, and the relay unbinds it (the nodes gauge drops).
			second.Close()
			await.Within(10*time.Second, func() bool { return e.Metric("relay_downstream_nodes") == 0 })
		}
		w.armed.Store(true)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		second.Register(ctx) // the connection closes before the answer
		e.Eventually("the second connection is carried by no one", func() bool {
			return e.Metric("relay_downstream_nodes") == 0 && e.Metric("relay_downstream_connections") == 0
		})

		run := sim.EscrowRun{Session: session, Start: time.Now(), Count: 4, Step: time.Minute, Window: 2 * time.Minute}
		body, err := run.Request()
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.Cloudly.Call(ctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, body)
		if err == nil {
			t.Fatal("escrow held a run for node-a, whose only connection has ended: it still counts the dead connection as the node's carrier")
		}
		wantRefusal(t, err, contracts.EscrowNodeNotCarried)
	})
}

// pausingWriter holds the relay's "node registered" log line — written by the relay between
// binding a node and telling its observers — until pause has run, once armed.
type pausingWriter struct {
	armed atomic.Bool
	pause func()
	once  sync.Once
}

func (w *pausingWriter) Write(p []byte) (int, error) {
	if w.armed.Load() && bytes.Contains(p, []byte(`"message":"node registered"`)) {
		w.once.Do(w.pause)
	}
	return len(p), nil
}
