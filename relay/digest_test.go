package relay_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/escrow"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// TestHoldDigestUnderAnotherPreimage: the seeds require the relay to check each renewal's digest
// ("validateHoldRuntimeNetworkDnsLeaseRenewalsRequest adds every renewal's digest check") without
// spelling the preimage. A Cloudly whose preimage is not the relay's assumed one has its run held
// anyway, counted (relay_escrow_digest_unverified_total), said once in the log (method, node,
// sequence; no digest) and shown on the status page; the run is released byte-identical to a node
// that verifies under its Cloudly's rule. A run digested under the relay's own rule leaves the
// count at 0, and a digest that is not sha256:<64 lowercase hex> is still escrow-run-invalid.
func TestHoldDigestUnderAnotherPreimage(t *testing.T) {
	start := func(t *testing.T) *relaytest.Env {
		return relaytest.Start(t, relaytest.Options{Build: func(cfg relay.Config, o relay.Options) (*relay.Relay, error) {
			esc, err := escrow.New(escrow.Options{Logger: o.Logger, Registerer: o.Registry})
			if err != nil {
				return nil, err
			}
			return relay.New(cfg, relay.Features{Parts: []relay.Part{{Name: "escrow", Impl: esc}}}, o)
		}})
	}
	hold := func(t *testing.T, e *relaytest.Env, n *sim.Node, preimage func([]byte) []byte) (json.RawMessage, json.RawMessage, error) {
		t.Helper()
		run := sim.EscrowRun{Session: n.Session(), Start: time.Now().Add(-30 * time.Second), Count: 4, Step: time.Minute,
			Window: 2 * time.Minute, Preimage: preimage}
		body, err := run.Request()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := e.Cloudly.Call(ctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, body)
		return body, resp, err
	}

	t.Run("another preimage: held, counted, shown, said once, released byte-identical", func(t *testing.T) {
		e := start(t)
		n := e.Node("node-a")
		n.RenewalPreimage = sim.PreimageWithoutNewline // the node verifies under its Cloudly's rule
		body, resp, err := hold(t, e, n, sim.PreimageWithoutNewline)
		if err != nil {
			t.Fatalf("a run digested under another preimage: %v", err)
		}
		if err := contracts.BindHoldRuntimeNetworkDnsLeaseRenewalsResponse(resp, 4); err != nil {
			t.Fatalf("answer %s: %v", resp, err)
		}
		if got := e.Metric("relay_escrow_digest_unverified_total"); got != 4 {
			t.Fatalf("relay_escrow_digest_unverified_total = %v, want 4", got)
		}
		lines := 0
		for _, l := range strings.Split(e.Logs.String(), "\n") {
			if !strings.Contains(l, `"outcome":"digest-unverified"`) {
				continue
			}
			lines++
			if !strings.Contains(l, `"method":"holdRuntimeNetworkDnsLeaseRenewals"`) || !strings.Contains(l, `"node":"node-a"`) ||
				!strings.Contains(l, `"sequence":1`) || strings.Contains(l, "sha256:") || strings.Contains(l, "sim-signature") {
				t.Fatalf("the log line names the wrong things or quotes the run: %s", l)
			}
		}
		if lines != 1 {
			t.Fatalf("%d log lines for one run, want 1", lines)
		}
		if st := escrowStatus(t, e); st.DigestUnverified != 4 || st.DigestRule != "assumed" {
			t.Fatalf("the status page shows %+v, want 4 unverified digests under the assumed rule", st)
		}
		e.Cloudly.SetAvailable(false)
		e.Eventually("the renewal released and admitted by the node", func() bool { return n.AdmittedRenewalSequence() == 1 })
		signed, _, _ := strictjson.Lookup(n.Last(contracts.MethodApplyRuntimeNetworkDnsLeaseRenewal), "signed")
		renewals, _, _ := strictjson.Lookup(body, "renewals")
		held, err := strictjson.ReadArray(renewals)
		if err != nil || string(signed) != string(held[0]) {
			t.Fatalf("released\n%s\nwant the envelope Cloudly sent\n%s", signed, held[0])
		}
	})

	t.Run("the relay's own rule: counted nothing", func(t *testing.T) {
		e := start(t)
		n := e.Node("node-a")
		if _, _, err := hold(t, e, n, nil); err != nil {
			t.Fatal(err)
		}
		if got := e.Metric("relay_escrow_digest_unverified_total"); got != 0 {
			t.Fatalf("relay_escrow_digest_unverified_total = %v, want 0", got)
		}
		if st := escrowStatus(t, e); st.DigestUnverified != 0 || st.DigestRule != "assumed" {
			t.Fatalf("status: %+v", st)
		}
	})

	t.Run("a malformed digest is still escrow-run-invalid", func(t *testing.T) {
		e := start(t)
		n := e.Node("node-a")
		upper := func(c []byte) []byte { return append([]byte("x"), c...) }
		run := sim.EscrowRun{Session: n.Session(), Start: time.Now(), Count: 2, Step: time.Minute, Window: 2 * time.Minute, Preimage: upper}
		body, err := run.Request()
		if err != nil {
			t.Fatal(err)
		}
		renewals, _, _ := strictjson.Lookup(body, "renewals")
		first, _ := strictjson.ReadArray(renewals)
		r, _, _ := strictjson.Lookup(first[0], "renewal")
		d, _, _ := strictjson.Lookup(r, "digest")
		bad := strings.Replace(string(body), string(d), strings.ToUpper(string(d)), 1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = e.Cloudly.Call(ctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, json.RawMessage(bad))
		wantRefusal(t, err, contracts.EscrowRunInvalid)
		if got := e.Metric("relay_escrow_digest_unverified_total"); got != 0 {
			t.Fatalf("relay_escrow_digest_unverified_total = %v after a refused run", got)
		}
	})
}

// escrowStatus is the escrow's section of the relay's /status.json.
func escrowStatus(t *testing.T, e *relaytest.Env) escrow.Status {
	t.Helper()
	resp, err := http.Get("http://" + e.Relay.AdminAddr().String() + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var page struct {
		Parts []struct {
			Name   string          `json:"name"`
			Status json.RawMessage `json:"status"`
		} `json:"parts"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		t.Fatal(err)
	}
	for _, p := range page.Parts {
		if p.Name == "escrow" {
			var st escrow.Status
			if err := json.Unmarshal(p.Status, &st); err != nil {
				t.Fatal(err)
			}
			return st
		}
	}
	t.Fatal("the status page has no escrow section")
	return escrow.Status{}
}
