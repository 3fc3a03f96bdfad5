package ingress_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/contracts"
)

const secretBearer = "ingress-bearer-DO-NOT-LOG-7f3a"

// routeTable is a table with certificates and keys in it, as Cloudly's are.
func routeTable(rev int64) string {
	return fmt.Sprintf(`{"revision":%d,"routes":[{"hostname":"app.example.com","target":"10.0.0.7:8080"}],`+
		`"certificates":[{"hostname":"app.example.com","key":"-----BEGIN PRIVATE KEY----- rev%d"}]}`, rev, rev)
}

// TestNodeAskingForTheTableIsRefusedIngressOnly: isolation is by authorization. A Pallet node's
// connection and a connection that never registered are refused relay-ingress-only by name.
func TestNodeAskingForTheTableIsRefusedIngressOnly(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.push(routeTable(3))
	n := h.node("node-a")
	_, err := n.Call(h.ctx(), contracts.MethodGetClusterIngressRouteTable, json.RawMessage(`{"knownRevision":null}`))
	if !errors.Is(err, contracts.RelayIngressOnly) {
		t.Fatalf("node asking for the table: %v, want relay-ingress-only", err)
	}
	if strings.Contains(remote(t, err).Text, "PRIVATE KEY") {
		t.Fatal("the refusal carries the table")
	}
	anon := h.ingress("node-b", "whatever", false)
	if _, err := anon.Pull(h.ctx()); !errors.Is(err, contracts.RelayIngressOnly) {
		t.Fatalf("unregistered connection asking for the table: %v, want relay-ingress-only", err)
	}
	if got := h.Metric("relay_ingress_route_table_reads_total", "outcome", "relay-ingress-only"); got != 2 {
		t.Fatalf("relay-ingress-only reads = %v, want 2", got)
	}
}

// TestRefusedIngressStaysRefused: Cloudly's IClusterIngressRegistrationRefusal reaches the
// ingress untouched, and the connection stays a plain one: no table, no hints.
func TestRefusedIngressStaysRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{logLevel: -1})
	h.control.Designate("node-a", "the-right-bearer")
	in := h.ingress("node-a", secretBearer, false)
	_, err := in.Register(h.ctx())
	e := remote(t, err)
	want := contracts.ClusterIngressRegistrationRefusal{Code: "cluster-ingress-registration-refused", Reason: "bearer-refused", RetryAfterMs: 5000}
	if e.Text != want.Text() || string(e.Data) != string(want.Data()) {
		t.Fatalf("refusal arrived as %q / %s, want Cloudly's %q / %s untouched", e.Text, e.Data, want.Text(), want.Data())
	}
	if r, ok := contracts.ReadClusterIngressRegistrationRefusal(e.Data); !ok || r.Reason != "bearer-refused" {
		t.Fatalf("the ingress cannot read the refusal: %s", e.Data)
	}
	if strings.Contains(e.Text+string(e.Data), secretBearer) {
		t.Fatal("the refusal quotes the bearer")
	}

	other := h.ingress("node-z", secretBearer, false)
	if _, err := other.Register(h.ctx()); !strings.Contains(string(remote(t, err).Data), `"reason":"node-mismatch"`) {
		t.Fatalf("undesignated node: %v", err)
	}

	// It stays refused: no table, and a newer table does not hint it.
	if _, err := in.Pull(h.ctx()); !errors.Is(err, contracts.RelayIngressOnly) {
		t.Fatalf("refused ingress asking for the table: %v", err)
	}
	ok := h.accepted("node-b", "bearer-b")
	h.push(routeTable(4))
	h.Eventually("the accepted ingress is hinted", func() bool { return len(ok.Hints()) == 1 })
	if got := in.Hints(); len(got) != 0 {
		t.Fatalf("refused ingress was hinted %v", got)
	}
	if _, err := in.Pull(h.ctx()); !errors.Is(err, contracts.RelayIngressOnly) {
		t.Fatalf("refused ingress after a push: %v", err)
	}
	if got := h.control.Registrations("bearer-refused"); got != 1 {
		t.Fatalf("Cloudly judged %d bearer refusals", got)
	}
	if strings.Contains(h.Logs.String(), secretBearer) {
		t.Fatal("a log line quotes the bearer")
	}
}

// TestIngressLosesAcceptanceWhenCloudlyRefusesItsNewestRegistration: an accepted connection whose
// next registration Cloudly refuses (a rotated bearer) is no ingress any more.
func TestIngressLosesAcceptanceWhenCloudlyRefusesItsNewestRegistration(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	in := h.accepted("node-a", "bearer-1")
	if _, err := in.Pull(h.ctx()); err != nil {
		t.Fatal(err)
	}
	h.control.Designate("node-a", "bearer-2")
	if _, err := in.Register(h.ctx()); err == nil {
		t.Fatal("a stale bearer was accepted")
	}
	if _, err := in.Pull(h.ctx()); !errors.Is(err, contracts.RelayIngressOnly) {
		t.Fatalf("after Cloudly refused the newest registration: %v", err)
	}
}

// TestAcceptedIngressGetsNullThenTheTableThenTheHint covers registration forwarding (Cloudly's
// answer untouched), null before any table, the table after a push, and the hint carrying the
// revision alone.
func TestAcceptedIngressGetsNullThenTheTableThenTheHint(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	in := h.ingress("node-a", "bearer-a", true)
	resp, err := in.Register(h.ctx())
	if err != nil {
		t.Fatal(err)
	}
	o, _ := contracts.RelayOffer.MarshalJSON()
	if want := `{"accepted":true,"revision":null,"protocol":` + string(o) + `}`; string(resp) != want {
		t.Fatalf("answer %s, want Cloudly's %s untouched", resp, want)
	}
	if h.Cloudly.Received(contracts.MethodRegisterClusterIngress) != 1 {
		t.Fatal("Cloudly did not see the registration once")
	}

	table, err := in.Pull(h.ctx())
	if err != nil || !table.IsNull() {
		t.Fatalf("before any table: %+v %v, want null", table, err)
	}
	resp, err = in.Call(h.ctx(), contracts.MethodGetClusterIngressRouteTable, json.RawMessage(`{"knownRevision":null}`))
	if err != nil || string(resp) != `{"table":null}` {
		t.Fatalf("before any table the relay answered %s %v, want {\"table\":null}", resp, err)
	}
	if in.TablesReceived() != 0 {
		t.Fatal("a null table counted as a table")
	}

	if got := h.push(routeTable(5)); got != `{"appliedRevision":5}` {
		t.Fatalf("push answered %s", got)
	}
	h.Eventually("the ingress pulls after the hint", func() bool { _, rev, ok := in.Table(); return ok && rev == 5 })
	if hint := string(in.LastHint()); hint != `{"revision":5}` {
		t.Fatalf("hint %s, want the revision alone", hint)
	}
	if raw, _, _ := in.Table(); string(raw) != routeTable(5) {
		t.Fatalf("table arrived as %s", raw)
	}
	if in.TablesReceived() != 1 || h.Metric("relay_ingress_route_table_hints_total", "outcome", "answered") != 1 {
		t.Fatalf("tables %d, hints answered %v", in.TablesReceived(), h.Metric("relay_ingress_route_table_hints_total", "outcome", "answered"))
	}
	// knownRevision does not change the answer: the relay answers the table it holds.
	resp, err = in.Call(h.ctx(), contracts.MethodGetClusterIngressRouteTable, json.RawMessage(`{"knownRevision":5}`))
	if err != nil || string(resp) != `{"table":`+routeTable(5)+`}` {
		t.Fatalf("with knownRevision 5: %.80s %v", resp, err)
	}
	if _, err := in.Call(h.ctx(), contracts.MethodGetClusterIngressRouteTable, json.RawMessage(`{"knownRevision":-1}`)); !errors.Is(err, contracts.RelayRequestInvalid) {
		t.Fatalf("bad knownRevision: %v", err)
	}
	if strings.Contains(h.Logs.String(), "PRIVATE KEY") || strings.Contains(h.Logs.String(), "bearer-a") {
		t.Fatal("a log line carries the table or the bearer")
	}
}

// TestOlderPushKeepsTheNewerRevision: only a newer table.revision is applied; appliedRevision
// states what the relay holds.
func TestOlderPushKeepsTheNewerRevision(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	in := h.accepted("node-a", "bearer-a")
	if got := h.push(routeTable(7)); got != `{"appliedRevision":7}` {
		t.Fatalf("push 7: %s", got)
	}
	h.Eventually("hint 7", func() bool { return len(in.Hints()) == 1 })
	for _, older := range []string{routeTable(3), `{"revision":7,"routes":"same revision, other bytes"}`, `null`} {
		if got := h.push(older); got != `{"appliedRevision":7}` {
			t.Fatalf("push %.30s: answered %s, want the held revision 7", older, got)
		}
	}
	table, err := in.Pull(h.ctx())
	if err != nil || string(table.Raw) != routeTable(7) {
		t.Fatalf("after older pushes the relay serves %.60s %v", table.Raw, err)
	}
	if hints := in.Hints(); len(hints) != 1 {
		t.Fatalf("older pushes hinted: %v", hints)
	}
	if h.Metric("relay_ingress_route_table_updates_total", "source", "push", "outcome", "stale") != 3 ||
		h.Metric("relay_ingress_route_table_revision") != 7 {
		t.Fatal("metrics do not show three stale pushes and revision 7")
	}
}

// TestTableWithoutRevisionIsServed: where a table states its revision is this project's guess
// (docs/decisions.md), so a table without one is still held, served and hinted, under a revision derived
// from its bytes. Such tables are ordered by arrival: another table replaces it, the same bytes
// again change nothing.
func TestTableWithoutRevisionIsServed(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	in := h.accepted("node-a", "bearer-a")
	a := `{"routes":[{"host":"a.example","port":443}],"key":"-----BEGIN PRIVATE KEY-----"}`
	revA := contracts.DeriveRouteTableRevision([]byte(a))
	applied := func(rev int64) string { return fmt.Sprintf(`{"appliedRevision":%d}`, rev) }
	if got := h.push(a); got != applied(revA) {
		t.Fatalf("push without a revision answered %s, want %s", got, applied(revA))
	}
	h.Eventually("the hint names the derived revision", func() bool { return slices.Contains(in.Hints(), revA) })
	if table, err := in.Pull(h.ctx()); err != nil || string(table.Raw) != a {
		t.Fatalf("the relay serves %.60s %v", table.Raw, err)
	}
	if got := h.push(a); got != applied(revA) || h.Metric("relay_ingress_route_table_updates_total", "source", "push", "outcome", "stale") != 1 {
		t.Fatalf("the same table again: %s; it must change nothing", got)
	}
	b := `{"routes":[]}`
	if got := h.push(b); got != applied(contracts.DeriveRouteTableRevision([]byte(b))) {
		t.Fatalf("another table without a revision: %s", got)
	}
	if table, _ := in.Pull(h.ctx()); string(table.Raw) != b {
		t.Fatalf("after a newer arrival the relay serves %.60s", table.Raw)
	}
	if got := h.push(routeTable(3)); got != `{"appliedRevision":3}` {
		t.Fatalf("a table with a revision after one without: %s", got)
	}
	if h.Metric("relay_ingress_route_table_updates_total", "source", "push", "outcome", "applied") != 3 {
		t.Fatal("three tables applied are not counted")
	}
	if strings.Contains(h.Logs.String(), "PRIVATE KEY") {
		t.Fatal("a log line carries the table")
	}
}

// TestTableSurvivesDetachmentAndIsPulledOnAttach: while Cloudly is away the relay serves the table
// it holds unchanged; on the next attach it pulls getClusterRouteTable and hints a newer table.
func TestTableSurvivesDetachmentAndIsPulledOnAttach(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	in := h.accepted("node-a", "bearer-a")
	h.push(routeTable(9))
	h.Eventually("the ingress holds 9", func() bool { _, rev, _ := in.Table(); return rev == 9 })
	pulls := h.Cloudly.Received(contracts.MethodGetClusterRouteTable)

	h.Cloudly.SetAvailable(false)
	h.Eventually("the relay is detached", func() bool { return !h.Relay.Upstream().Attached() })
	table, err := in.Pull(h.ctx())
	if err != nil || string(table.Raw) != routeTable(9) {
		t.Fatalf("detached relay serves %.60s %v", table.Raw, err)
	}
	late := h.ingress("node-b", "bearer-b", true)
	if _, err := late.Register(h.ctx()); !errors.Is(err, contracts.RelayUpstreamDetached) {
		t.Fatalf("registration while detached: %v", err)
	}

	h.control.SetTable(json.RawMessage(routeTable(10))) // computed while the relay was away
	h.Cloudly.SetAvailable(true)
	h.Eventually("the relay pulls on attach", func() bool { return h.Cloudly.Received(contracts.MethodGetClusterRouteTable) > pulls })
	h.Eventually("the ingress holds 10", func() bool { _, rev, _ := in.Table(); return rev == 10 })
	if raw, _, _ := in.Table(); string(raw) != routeTable(10) {
		t.Fatalf("after re-attach: %s", raw)
	}
}

// TestTwentyDigitIntegerArrivesExact: the relay keeps the table opaque; a 20-digit integer, an
// exponent and escapes arrive byte-identical, and so does a table far beyond the 64 KiB limit of
// an unregistered connection.
func TestTwentyDigitIntegerArrivesExact(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	in := h.accepted("node-a", "bearer-a")
	exact := `{"revision":11,"weights":[12345678901234567890,-98765432109876543210],"ratio":1.0e+2,"s":"\u00e9\/"}`
	h.push(exact)
	h.Eventually("table 11", func() bool { _, rev, _ := in.Table(); return rev == 11 })
	if raw, _, _ := in.Table(); string(raw) != exact {
		t.Fatalf("table arrived as %s, want %s", raw, exact)
	}

	big := `{"revision":12,"pad":"` + strings.Repeat("k", 3<<20) + `","n":12345678901234567890}`
	h.push(big)
	h.Eventually("table 12", func() bool { _, rev, _ := in.Table(); return rev == 12 })
	if raw, _, _ := in.Table(); string(raw) != big {
		t.Fatalf("3 MiB table changed on its way (%d bytes arrived)", len(raw))
	}
	if h.Metric("relay_ingress_route_table_bytes") != float64(len(big)) {
		t.Fatal("route_table_bytes does not state the table's size")
	}
}

// TestRegistrationOfAnotherMajorIsRefusedByTheRelay: the relay negotiates first; Cloudly sees
// nothing and the connection gains nothing.
func TestRegistrationOfAnotherMajorIsRefusedByTheRelay(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	in := h.ingress("node-a", "bearer-a", true)
	in.Offer = contracts.ProtocolOffer{InterfacesVersion: "33.1.0", MinimumPeerVersion: "33.0.0"}
	_, err := in.Register(h.ctx())
	e := remote(t, err)
	r, ok := contracts.ReadProtocolRefusal(e.Data)
	if !ok || r.Reason != contracts.MajorMismatch || r.Refusing != contracts.RelayOffer || r.Refused != in.Offer {
		t.Fatalf("refusal %q / %s, want the IProtocolRefusal major-mismatch", e.Text, e.Data)
	}
	if !strings.HasPrefix(e.Text, "protocol-incompatible") {
		t.Fatalf("text %q", e.Text)
	}
	if got := h.Cloudly.Received(contracts.MethodRegisterClusterIngress); got != 0 {
		t.Fatalf("Cloudly saw %d registrations", got)
	}
	if _, err := in.Pull(h.ctx()); !errors.Is(err, contracts.RelayIngressOnly) {
		t.Fatalf("refused offer gained access: %v", err)
	}
	// A later body of another major, with keys this relay does not know, is still a protocol
	// refusal: the offer is read before the exact-key shape check.
	body := `{"bearer":"` + secretBearer + `","version":"4.0.0","nodeId":"node-a","protocol":{"interfacesVersion":"33.0.0","minimumPeerVersion":"33.0.0"},"future":1}`
	_, err = in.Call(h.ctx(), contracts.MethodRegisterClusterIngress, json.RawMessage(body))
	if _, ok := contracts.ReadProtocolRefusal(remote(t, err).Data); !ok {
		t.Fatalf("another major with unknown keys: %v", err)
	}
	if h.Cloudly.Received(contracts.MethodRegisterClusterIngress) != 0 || h.Metric("relay_ingress_registrations_total", "outcome", "protocol-incompatible") != 2 {
		t.Fatal("Cloudly saw a registration, or the refusals were not counted")
	}
}

// TestInvalidRegistrationIsRefusedByTheRelay: a body that fails the shape check is refused by the
// relay without asking Cloudly, with fixed messages that never quote the bearer.
func TestInvalidRegistrationIsRefusedByTheRelay(t *testing.T) {
	h := newHarness(t, harnessOptions{logLevel: -1})
	in := h.ingress("node-a", secretBearer, true)
	o, _ := contracts.RelayOffer.MarshalJSON()
	for _, body := range []string{
		`{"bearer":"` + secretBearer + `","version":"3.0.0","nodeId":"node a","protocol":` + string(o) + `}`,
		`{"bearer":"` + secretBearer + `","version":"3.0.0","nodeId":"node-a","protocol":` + string(o) + `,"extra":1}`,
		`{"bearer":"` + secretBearer + `","version":"3.0.0","nodeId":"node-a"}`,
	} {
		_, err := in.Call(h.ctx(), contracts.MethodRegisterClusterIngress, json.RawMessage(body))
		if !errors.Is(err, contracts.RelayRequestInvalid) {
			t.Fatalf("%s: %v, want relay-request-invalid", body, err)
		}
		// In the seed's shape, which is all an ingress built from the seeds reads.
		data := remote(t, err).Data
		if reasons := contracts.ValidateClusterIngressRegistrationRefusal(data, ""); len(reasons) > 0 {
			t.Fatalf("%s: error data %s: %q", body, data, reasons)
		}
		if r, _ := contracts.ReadClusterIngressRegistrationRefusal(data); r.Reason != "registration-invalid" || r.RetryAfterMs != 300_000 {
			t.Fatalf("%s: refusal %+v, want registration-invalid after 300 000 ms", body, r)
		}
		if strings.Contains(err.Error(), secretBearer) {
			t.Fatalf("refusal quotes the bearer: %v", err)
		}
	}
	if h.Cloudly.Received(contracts.MethodRegisterClusterIngress) != 0 {
		t.Fatal("Cloudly saw an invalid registration")
	}
	if strings.Contains(h.Logs.String(), secretBearer) {
		t.Fatal("a log line quotes the bearer")
	}
}

// TestNewerRegistrationOfTheSameNodeSupersedes: one ingress connection per node; the older
// connection is no ingress any more.
func TestNewerRegistrationOfTheSameNodeSupersedes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	old := h.accepted("node-a", "bearer-a")
	newer := h.accepted("node-a", "bearer-a")
	if _, err := old.Pull(h.ctx()); !errors.Is(err, contracts.RelayIngressOnly) {
		t.Fatalf("superseded connection: %v", err)
	}
	if _, err := newer.Pull(h.ctx()); err != nil {
		t.Fatalf("newer connection: %v", err)
	}
	if h.Metric("relay_ingress_connections") != 1 {
		t.Fatal("connections gauge")
	}
	newer.Close()
	h.Eventually("the gauge drops", func() bool { return h.Metric("relay_ingress_connections") == 0 })
}

// TestNodeConnectionCannotRegisterAnIngress: one connection carries one peer (the relay's rule).
func TestNodeConnectionCannotRegisterAnIngress(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	n := h.node("node-a")
	h.control.Designate("node-a", "bearer-a")
	in := ingressBody("node-a", "bearer-a")
	if _, err := n.Call(h.ctx(), contracts.MethodRegisterClusterIngress, in); !errors.Is(err, contracts.RelaySessionForeign) {
		t.Fatalf("node connection registering an ingress: %v", err)
	}
	if _, err := n.Call(h.ctx(), contracts.MethodGetClusterIngressRouteTable, json.RawMessage(`{"knownRevision":null}`)); !errors.Is(err, contracts.RelayIngressOnly) {
		t.Fatalf("node connection: %v", err)
	}
}

func ingressBody(node, bearer string) json.RawMessage {
	return contracts.EncodeClusterIngressRegistration(contracts.ClusterIngressRegistration{
		Bearer: contracts.NewSecret(bearer), Version: "3.0.0", NodeID: node, Protocol: contracts.RelayOffer})
}
