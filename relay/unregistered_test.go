package relay_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"code.foss.global/serve.zone/relay/internal/relaytest"
	"code.foss.global/serve.zone/relay/internal/sim"
)

// Connections that have not registered are bounded (SPEC §2: an anonymous peer must not make the
// relay hold much): beyond the limit an upgrade is answered 503, and a registration accepted
// frees a place.
func TestUnregisteredConnectionsAreBounded(t *testing.T) {
	e := relaytest.Start(t, relaytest.Options{MaxUnregistered: 2})
	first := e.Dial("node-a")
	e.Dial("node-b")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, e.URL, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a third unregistered connection: %v (response %v), want 503", err, resp)
	}
	if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "limit"); got != 1 {
		t.Fatalf("unregistered_closed_total{limit} = %v, want 1", got)
	}

	if _, err := first.Register(ctx); err != nil {
		t.Fatal(err)
	}
	third := e.Dial("node-c") // node-a's place is free again
	if _, err := third.Register(ctx); err != nil {
		t.Fatal(err)
	}
}

// A connection that does not register within the deadline is closed 1008; one whose registration
// is still with Cloudly at the deadline is not, and a registered one stays.
func TestConnectionThatDoesNotRegisterIsClosed(t *testing.T) {
	const deadline = 300 * time.Millisecond
	e := relaytest.Start(t, relaytest.Options{RegisterDeadline: deadline})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	registered := e.Node("node-a")
	e.Cloudly.SetSlowness(3 * deadline) // node-b's registration is still with Cloudly at its deadline
	slow := e.Dial("node-b")
	if _, err := slow.Register(ctx); err != nil {
		t.Fatalf("a registration answered after the deadline: %v", err)
	}
	e.Cloudly.SetSlowness(0)

	ws, _, err := websocket.Dial(ctx, e.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	_, _, err = ws.Read(ctx) // the relay sends nothing until it closes the connection
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation {
		t.Fatalf("an unregistered connection ended with %v, want close 1008", err)
	}
	if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "overdue"); got != 1 {
		t.Fatalf("unregistered_closed_total{overdue} = %v, want 1 (only the anonymous connection)", got)
	}
	for _, n := range []*sim.Node{registered, slow} {
		if _, err := n.Report(ctx, "reportRuntimeAssignmentObservation", map[string]any{}); err != nil {
			t.Fatalf("%s after the deadline: %v", n.ID, err)
		}
	}
}
