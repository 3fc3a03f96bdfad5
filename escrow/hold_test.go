package escrow

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"code.foss.global/serve.zone/relay/contracts"
)

// holdFixture is an attached escrow at slot0 + 1 min carrying node-a (Cloudly A's session),
// node-b (Cloudly B's session) and _node-c (namespace rt-other); node-gone was carried and left.
func holdFixture(t *testing.T) (*Escrow, *clock, *prometheus.Registry) {
	t.Helper()
	clk := &clock{now: slot0 + minute}
	reg := prometheus.NewRegistry()
	e, err := New(Options{Registerer: reg, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	e.Attached(nil)
	e.NodeBound(newFakeNode("node-a", cloudlyA, "rt-cluster-a", 1))
	e.NodeBound(newFakeNode("node-b", cloudlyB, "rt-cluster-a", 1))
	e.NodeBound(newFakeNode("_node-c", cloudlyA, "rt-other", 1))
	gone := newFakeNode("node-gone", cloudlyA, "rt-cluster-a", 1)
	e.NodeBound(gone)
	gone.end()
	return e, clk, reg
}

func TestHoldRefusalsByName(t *testing.T) {
	grid := gridRun("node-a", 23, slot0)
	cases := []struct {
		name        string
		fromCloudly bool
		body        func(t testing.TB) json.RawMessage
		refusal     contracts.RefusalName // "" for held
		held        int
	}{
		{"23 renewals on the intended grid held", true, grid.body, "", 23},
		{"32 renewals held", true, runSpec{node: "node-a", n: 32, start: slot0, step: 5 * minute, window: 5 * minute}.body, "", 32},
		{"33 renewals refused", true, runSpec{node: "node-a", n: 33, start: slot0, step: 5 * minute, window: 5 * minute}.body, contracts.EscrowRunInvalid, 0},
		{"horizon exactly 4 h held", true, runSpec{node: "node-a", n: 2, start: slot0, step: 225 * minute, window: 15 * minute}.body, "", 2},
		{"horizon 4 h + 1 ms refused", true, runSpec{node: "node-a", n: 2, start: slot0, step: 225*minute + 1, window: 15 * minute}.body, contracts.EscrowRunInvalid, 0},
		{"window 15 min + 1 ms refused", true, runSpec{node: "node-a", n: 1, start: slot0, step: 0, window: 15*minute + 1}.body, contracts.EscrowRunInvalid, 0},
		{"digest the relay cannot reproduce held (TestHoldDigestUnverified)", true, func(t testing.TB) json.RawMessage {
			h := grid.request(t)
			d := h.Renewals[5].Renewal.Digest
			flipped := d[:len(d)-1] + string("0123456789abcdef"[(strings.IndexByte("0123456789abcdef", d[len(d)-1])+1)%16])
			h.Renewals[5].Raw = json.RawMessage(strings.Replace(string(h.Renewals[5].AppendJSON(nil)), d, flipped, 1))
			return h.AppendJSON(nil)
		}, "", 23},
		{"malformed digest refused", true, func(t testing.TB) json.RawMessage {
			h := grid.request(t)
			d := h.Renewals[5].Renewal.Digest
			h.Renewals[5].Raw = json.RawMessage(strings.Replace(string(h.Renewals[5].AppendJSON(nil)), d, strings.ToUpper(d), 1))
			return h.AppendJSON(nil)
		}, contracts.EscrowRunInvalid, 0},
		{"two signing authority revisions refused", true, func(t testing.TB) json.RawMessage {
			h := grid.request(t)
			h.Renewals[3].Authority = json.RawMessage(`{"id":"authority-a","revision":3}`)
			return h.AppendJSON(nil)
		}, contracts.EscrowRunInvalid, 0},
		{"unknown key refused", true, func(t testing.TB) json.RawMessage {
			return json.RawMessage(strings.Replace(string(grid.body(t)), `{"nodeId"`, `{"schemaVersion":1,"nodeId"`, 1))
		}, contracts.EscrowRunInvalid, 0},
		{"not JSON refused", true, func(testing.TB) json.RawMessage { return json.RawMessage(`{"nodeId":`) }, contracts.EscrowRunInvalid, 0},
		{"from a node connection refused", false, grid.body, contracts.EscrowCloudlyOnly, 0},
		{"invalid from a node connection refused as cloudly-only first", false, func(testing.TB) json.RawMessage { return json.RawMessage(`[]`) }, contracts.EscrowCloudlyOnly, 0},
		{"node never carried", true, gridRun("node-z", 3, slot0).body, contracts.EscrowNodeNotCarried, 0},
		{"node whose connection ended", true, gridRun("node-gone", 3, slot0).body, contracts.EscrowNodeNotCarried, 0},
		{"node carried on another controller's session", true, gridRun("node-b", 3, slot0).body, contracts.EscrowRunForeignSession, 0},
		{"run in another namespace", true, gridRun("_node-c", 3, slot0).body, contracts.EscrowRunForeignSession, 0},
		{"equal sequences refused as unordered", true, runSpec{node: "node-a", n: 3, start: slot0, step: 10 * minute, window: 15 * minute,
			edit: func(i int, r *contracts.RuntimeNetworkDnsLeaseRenewal) {
				if i == 2 {
					r.Sequence = 2
				}
			}}.body, contracts.EscrowRunUnordered, 0},
		{"window not extending its predecessor", true, runSpec{node: "node-a", n: 3, start: slot0, step: 10 * minute, window: 15 * minute,
			edit: func(i int, r *contracts.RuntimeNetworkDnsLeaseRenewal) {
				if i == 2 {
					r.Dns.ExpiresAt = slot0 + 25*minute // the same end as renewal 2
					r.Dns.IssuedAt, r.Dns.NotBefore = slot0+15*minute, slot0+15*minute
				}
			}}.body, contracts.EscrowRunUnordered, 0},
		{"window moving issuedAt back", true, runSpec{node: "node-a", n: 3, start: slot0, step: 2 * minute, window: 5 * minute,
			edit: func(i int, r *contracts.RuntimeNetworkDnsLeaseRenewal) {
				if i == 1 {
					r.Dns.IssuedAt = slot0 - 1
				}
			}}.body, contracts.EscrowRunUnordered, 0},
		{"last window ended", true, gridRun("node-a", 1, slot0-15*minute).body, contracts.EscrowRunStale, 0},
		{"last window ends now", true, runSpec{node: "node-a", n: 1, start: slot0, window: minute}.body, contracts.EscrowRunStale, 0},
		{"last window ends 1 ms from now held", true, runSpec{node: "node-a", n: 1, start: slot0, window: minute + 1}.body, "", 1},
		{"future run held", true, gridRun("node-a", 3, slot0+60*minute).body, "", 3},
		// The order of judgement: the first rule broken names the refusal.
		{"invalid before not carried", true, runSpec{node: "node-z", n: 33, start: slot0, step: 5 * minute, window: 5 * minute}.body, contracts.EscrowRunInvalid, 0},
		{"not carried before foreign", true, gridRun("node-z", 3, slot0).body, contracts.EscrowNodeNotCarried, 0},
		{"foreign before unordered", true, runSpec{node: "node-b", n: 2, start: slot0, step: 10 * minute, window: 15 * minute,
			edit: func(_ int, r *contracts.RuntimeNetworkDnsLeaseRenewal) { r.Sequence = 1 }}.body, contracts.EscrowRunForeignSession, 0},
		{"unordered before stale", true, runSpec{node: "node-a", n: 2, start: slot0 - 40*minute, step: 10 * minute, window: 15 * minute,
			edit: func(_ int, r *contracts.RuntimeNetworkDnsLeaseRenewal) { r.Sequence = 1 }}.body, contracts.EscrowRunUnordered, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, _, reg := holdFixture(t)
			resp, err := e.Hold(c.fromCloudly, c.body(t))
			if c.refusal == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if err := contracts.BindHoldRuntimeNetworkDnsLeaseRenewalsResponse(resp, c.held); err != nil {
					t.Fatalf("answer %s: %v", resp, err)
				}
				if got := testutil.ToFloat64(e.metrics.renewals); got != float64(c.held) {
					t.Fatalf("renewals held = %v, want %d", got, c.held)
				}
				return
			}
			if !errors.Is(err, c.refusal) || !strings.HasPrefix(err.Error(), string(c.refusal)+": ") || resp != nil {
				t.Fatalf("answer %s, error %v; want %s", resp, err, c.refusal)
			}
			if len(err.Error()) > 4096 || strings.Contains(err.Error(), "sig-") {
				t.Fatalf("reason too long or quoting a signature: %v", err)
			}
			if got := testutil.ToFloat64(e.metrics.runs); got != 0 {
				t.Fatalf("a refused run is held: runs = %v", got)
			}
			if got := testutil.ToFloat64(e.metrics.holds.WithLabelValues(string(c.refusal))); got != 1 {
				t.Fatalf("holds_total{outcome=%s} = %v", c.refusal, got)
			}
			_ = reg
		})
	}
}

func TestEveryRefusalNameIsTested(t *testing.T) {
	// The table above names each of the seed's six; this keeps the vocabulary and the table in step.
	for _, n := range contracts.HoldRuntimeNetworkDnsLeaseRenewalsRefusals() {
		switch n {
		case contracts.EscrowRunInvalid, contracts.EscrowNodeNotCarried, contracts.EscrowRunForeignSession,
			contracts.EscrowRunStale, contracts.EscrowRunUnordered, contracts.EscrowCloudlyOnly:
		default:
			t.Errorf("refusal %s has no case", n)
		}
	}
}

func TestHoldReplacesAndEmptyRunClears(t *testing.T) {
	e, _, _ := holdFixture(t)
	if _, err := e.Hold(true, gridRun("node-a", 23, slot0).body(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Hold(true, gridRun("node-a", 5, slot0).body(t)); err != nil {
		t.Fatal(err)
	}
	if r, n := testutil.ToFloat64(e.metrics.runs), testutil.ToFloat64(e.metrics.renewals); r != 1 || n != 5 {
		t.Fatalf("after replacing: runs %v renewals %v, want 1 and 5", r, n)
	}
	empty := []byte(`{"nodeId":"node-a","projection":` + string(projectionOf("node-a").AppendJSON(nil)) + `,"renewals":[]}`)
	resp, err := e.Hold(true, empty)
	if err != nil || string(resp) != `{"held":0}` {
		t.Fatalf("empty run: %s %v", resp, err)
	}
	if r, n := testutil.ToFloat64(e.metrics.runs), testutil.ToFloat64(e.metrics.renewals); r != 0 || n != 0 {
		t.Fatalf("after clearing: runs %v renewals %v", r, n)
	}
	// Clearing needs no carried session: Cloudly may withdraw a run whatever the node's state.
	emptyGone := []byte(`{"nodeId":"node-gone","projection":` + string(projectionOf("node-gone").AppendJSON(nil)) + `,"renewals":[]}`)
	if resp, err := e.Hold(true, emptyGone); err != nil || string(resp) != `{"held":0}` {
		t.Fatalf("empty run for a node not carried: %s %v", resp, err)
	}
	// But an empty run is still judged for shape, and only from Cloudly.
	if _, err := e.Hold(true, []byte(`{"nodeId":"node.a","projection":`+string(projectionOf("x").AppendJSON(nil))+`,"renewals":[]}`)); !errors.Is(err, contracts.EscrowRunInvalid) {
		t.Fatalf("empty run with a bad node id: %v", err)
	}
	if _, err := e.Hold(false, empty); !errors.Is(err, contracts.EscrowCloudlyOnly) {
		t.Fatalf("empty run from a node: %v", err)
	}
	if got := testutil.ToFloat64(e.metrics.holds.WithLabelValues("cleared")); got != 2 {
		t.Fatalf("holds_total{cleared} = %v", got)
	}
}

func TestHeldRunKeepsEnvelopesOnceAndCompact(t *testing.T) {
	body := gridRun("node-a", 23, slot0).body(t)
	req, err := contracts.ReadHoldRuntimeNetworkDnsLeaseRenewalsRequest(body)
	if err != nil {
		t.Fatal(err)
	}
	h := &req
	run := newHeldRun(h)
	total := 0
	for i, s := range h.Renewals {
		if string(run.envelope(i)) != string(s.AppendJSON(nil)) {
			t.Fatalf("envelope %d changed", i)
		}
		total += len(s.AppendJSON(nil))
		if ref := run.reference(i); ref != s.Renewal.Reference() {
			t.Fatalf("reference %d = %+v", i, ref)
		}
	}
	if len(run.envelopes) != total || cap(run.envelopes) != total {
		t.Fatalf("envelopes %d bytes (cap %d), want exactly %d", len(run.envelopes), cap(run.envelopes), total)
	}
	// The run shares nothing with the request's buffer.
	for i := range h.Renewals {
		if &run.envelope(i)[0] == &h.Renewals[i].Raw[0] {
			t.Fatal("run aliases the request")
		}
	}
}
