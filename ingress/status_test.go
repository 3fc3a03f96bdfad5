package ingress_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/ingress"
)

// TestStatusShowsConnectionsAndTheRouteTableRevisionAndAge: a connected ingress and the route
// table's revision, size and arrival, as the status page sees them; an older push changes neither
// the revision nor the arrival, and neither the table nor the bearer is ever shown.
func TestStatusShowsConnectionsAndTheRouteTableRevisionAndAge(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	st := h.status()
	if st.Connections != 0 || len(st.Nodes) != 0 || st.RouteTable.Revision != -1 || st.RouteTable.ReceivedAt != nil ||
		st.RouteTable.AgeSeconds != nil {
		t.Fatalf("before any ingress or table: %+v", st)
	}

	h.accepted("node-b", "bearer-status-b")
	h.accepted("node-a", "bearer-status-a")
	before := time.Now()
	h.push(routeTable(5))
	after := time.Now()
	st = h.status()
	if st.Connections != 2 || st.Registering != 0 || strings.Join(st.Nodes, ",") != "node-a,node-b" {
		t.Fatalf("two ingresses connected: %+v", st)
	}
	rt := st.RouteTable
	if rt.Revision != 5 || rt.Derived || rt.Bytes != len(routeTable(5)) || rt.ReceivedAt == nil ||
		rt.ReceivedAt.Before(before) || rt.ReceivedAt.After(after) || rt.AgeSeconds == nil || *rt.AgeSeconds < 0 ||
		*rt.AgeSeconds > int64(time.Since(before)/time.Second)+1 {
		t.Fatalf("after a push of revision 5 between %v and %v: %+v", before, after, rt)
	}
	received := *rt.ReceivedAt

	h.push(routeTable(3)) // older: not applied
	if rt := h.status().RouteTable; rt.Revision != 5 || !rt.ReceivedAt.Equal(received) {
		t.Fatalf("an older push changed the status: %+v", rt)
	}
	h.push(routeTable(6))
	if rt := h.status().RouteTable; rt.Revision != 6 || rt.ReceivedAt.Before(received) || rt.Bytes != len(routeTable(6)) {
		t.Fatalf("after revision 6: %+v", rt)
	}
}

// status is the server's Status, checked to marshal without the table or a bearer.
func (h *harness) status() ingress.Status {
	h.T.Helper()
	st, ok := h.server.Status().(ingress.Status)
	if !ok {
		h.T.Fatalf("Status() is a %T", h.server.Status())
	}
	out, err := json.Marshal(st)
	if err != nil {
		h.T.Fatal(err)
	}
	for _, secret := range []string{"bearer-status", "PRIVATE KEY", "app.example.com", "10.0.0.7"} {
		if strings.Contains(string(out), secret) {
			h.T.Fatalf("the status shows %q: %s", secret, out)
		}
	}
	return st
}
