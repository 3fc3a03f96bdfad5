package relay_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
)

// A node registration Cloudly accepts after the node's connection has already ended must not bind
// the node to that dead connection: the node table would keep it for ever, the nodes gauge would
// count a node nobody carries, and a later (live) connection of the same node would be closed as
// "superseded" by the dead one.
func TestLateRegistrationAnswerDoesNotBindAClosedConnection(t *testing.T) {
	e := start(t, relay.Features{})
	live := e.node("node-a") // the node's current, healthy connection
	e.cloudly.SetSlowness(400 * time.Millisecond)

	n := newNode(t, e, "node-a")
	if err := n.Conn().CallAsync(contracts.MethodRegisterPalletRuntimeSession, n.RegistrationBody(), 0, func(typedsocket.Reply) {}); err != nil {
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
	time.Sleep(100 * time.Millisecond)
	e.cloudly.SetSlowness(0)

	select {
	case <-live.Conn().Done():
		t.Fatalf("the live connection of node-a was closed (%v) because a dead connection's registration was accepted late",
			context.Cause(live.Conn().Context()))
	default:
	}
	if got := e.Metric("relay_downstream_nodes"); got != 1 {
		t.Errorf("relay_downstream_nodes = %v with one connection carrying node-a", got)
	}
	if _, err := e.cloudly.Call(ctx5(t), "applyRuntimeAssignment", json.RawMessage(`{"session":{"nodeId":"node-a"}}`)); err != nil {
		t.Fatalf("Cloudly → node-a after the dead connection's late registration: %v", err)
	}
}

// The same late answer with no other connection: the relay must not count (or keep in its node
// table) a node whose only connection is gone.
func TestLateRegistrationAnswerLeavesNoStaleNode(t *testing.T) {
	e := start(t, relay.Features{})
	e.cloudly.SetSlowness(400 * time.Millisecond)
	n := newNode(t, e, "node-a")
	if err := n.Conn().CallAsync(contracts.MethodRegisterPalletRuntimeSession, n.RegistrationBody(), 0, func(typedsocket.Reply) {}); err != nil {
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
}
