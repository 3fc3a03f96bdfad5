package sim

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
)

var simSession = json.RawMessage(`{"controller":{"kind":"cloudly","id":"cloudly-sim"},"clusterId":"cluster-sim",` +
	`"nodeId":"-node-1","runtimeNamespace":"rt-cluster-sim","generation":1,"epoch":1}`)

func TestEscrowRunIsAValidHoldRequest(t *testing.T) {
	start := time.UnixMilli(1_764_417_600_000)
	for _, run := range []EscrowRun{
		{Session: simSession, Start: start}, // defaults: 23 renewals on the intended grid
		{Session: simSession, Start: start, Count: 32, Step: 2 * time.Second, Window: 3 * time.Second, FirstSequence: 7},
	} {
		body, err := run.Request()
		if err != nil {
			t.Fatal(err)
		}
		if reasons := contracts.ValidateHoldRuntimeNetworkDnsLeaseRenewalsRequest(body); reasons != nil {
			t.Fatalf("invalid: %q", reasons)
		}
		h, _ := contracts.ReadHoldRuntimeNetworkDnsLeaseRenewalsRequest(body)
		s, _ := contracts.ReadRuntimeSession(simSession)
		if h.NodeID != "-node-1" || h.ScopeReasons(s) != nil {
			t.Fatalf("run not in the session's scope: %+v", h)
		}
		windows := run.Windows()
		if len(h.Renewals) != len(windows) {
			t.Fatalf("%d renewals, %d windows", len(h.Renewals), len(windows))
		}
		for i, r := range h.Renewals {
			if r.Renewal.Dns != windows[i] {
				t.Fatalf("renewal %d window %+v, want %+v", i, r.Renewal.Dns, windows[i])
			}
		}
	}
	if _, err := (EscrowRun{Session: json.RawMessage(`{}`), Start: start}).Request(); err == nil {
		t.Fatal("a run for an unreadable session was built")
	}
}

func TestCountRenewalsAdmitsByTheNodeRules(t *testing.T) {
	n := NewNode("-node-1", zerolog.Nop())
	now := int64(1_764_417_600_000 + 1000)
	n.Now = func() int64 { return now }
	n.session = simSession // the binding the node obtained: pushes must come under it
	c := RecordRenewals(n)
	run := EscrowRun{Session: simSession, Start: time.UnixMilli(1_764_417_600_000), Count: 3, Step: 2 * time.Second, Window: 3 * time.Second}
	h, _ := run.build()
	apply := func(i int) {
		body := contracts.AppendApplyRuntimeNetworkDnsLeaseRenewalRequest(nil, simSession, h.Renewals[i].AppendJSON(nil))
		n.mu.Lock()
		f := n.handlers[contracts.MethodApplyRuntimeNetworkDnsLeaseRenewal]
		n.mu.Unlock()
		f(body)
	}
	n.mu.Lock()
	f := n.handlers[contracts.MethodApplyRuntimeNetworkDnsLeaseRenewal]
	n.mu.Unlock()
	otherEpoch := json.RawMessage(`{"controller":{"kind":"cloudly","id":"cloudly-sim"},"clusterId":"cluster-sim",` +
		`"nodeId":"-node-1","runtimeNamespace":"rt-cluster-sim","generation":1,"epoch":2}`)
	for name, body := range map[string][]byte{
		"another session": contracts.AppendApplyRuntimeNetworkDnsLeaseRenewalRequest(nil, otherEpoch, h.Renewals[0].AppendJSON(nil)),
		"an extra key":    append(contracts.AppendApplyRuntimeNetworkDnsLeaseRenewalRequest(nil, simSession, h.Renewals[0].AppendJSON(nil))[:0:0], []byte(`{"session":`+string(simSession)+`,"signed":`+string(h.Renewals[0].AppendJSON(nil))+`,"nodeId":"-node-1"}`)...),
		"a broken digest": contracts.AppendApplyRuntimeNetworkDnsLeaseRenewalRequest(nil, simSession, []byte(strings.Replace(string(h.Renewals[0].AppendJSON(nil)), `"sequence":1`, `"sequence":9`, 1))),
	} {
		if _, err := f(body); err == nil {
			t.Fatalf("the node admitted a renewal pushed with %s", name)
		}
	}
	c = RecordRenewals(n) // forget the refusals above
	apply(0)              // current: accepted
	apply(0)              // again: replay
	apply(1)              // not yet open: refused
	now += 2000
	apply(1) // open now: accepted
	var statuses []string
	for _, r := range c.Receipts() {
		statuses = append(statuses, r.Status)
	}
	if c.Admitted() != 2 || len(statuses) != 4 || statuses[0] != "accepted" || statuses[1] != "replay" || statuses[2] != "refused" || statuses[3] != "accepted" {
		t.Fatalf("admitted %d, statuses %v", c.Admitted(), statuses)
	}
}
