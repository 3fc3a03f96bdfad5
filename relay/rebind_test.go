package relay_test

import (
	"context"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/escrow"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// TestDetachedRebinding: a node whose socket drops while the relay is detached registers again
// with the byte-identical body, is answered with Cloudly's earlier answer, is bound to its
// session again, and receives its renewals (not the one it acknowledged before); any other
// registration is refused
// relay-upstream-detached (SPEC §6).
func TestDetachedRebinding(t *testing.T) {
	esc, err := escrow.New(escrow.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := relaytest.Start(t, relaytest.Options{Features: relay.Features{Parts: []relay.Part{{Name: "escrow", Impl: esc}}}})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second) // the calls' bound: the test waits for a slot
	defer cancel()

	first := e.Node("node-a")
	answer := e.Cloudly.Session("node-a")
	// The first slot is current now; the second opens 10 s later.
	run := sim.EscrowRun{Session: first.Session(), Start: time.Now().Add(-50 * time.Second), Count: 4, Step: time.Minute, Window: 2 * time.Minute}
	body, err := run.Request()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Cloudly.Call(ctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, body); err != nil {
		t.Fatal(err)
	}
	e.Cloudly.SetAvailable(false)
	e.Eventually("detached", func() bool { return !e.Relay.Upstream().Attached() })
	e.Eventually("the renewal released to the first connection", func() bool { return first.AdmittedRenewalSequence() == 1 })

	// The node's socket drops; it comes back as it was, same credential and instance nonce.
	first.Close()
	again := sim.NewNode("node-a", e.Log)
	again.Nonce, again.Bearer, again.Generation = first.Nonce, first.Bearer, first.Generation
	if err := again.Connect(ctx, e.URL); err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	resp, err := again.Register(ctx)
	if err != nil {
		t.Fatalf("the identical registration while detached: %v", err)
	}
	if got, want := string(again.Session()), string(first.Session()); got != want {
		t.Fatalf("re-bound to session %s, want the one Cloudly answered: %s (answer %s; Cloudly's %s)", got, want, resp, answer)
	}
	// The node acknowledged renewal 1 on its first connection: the re-bound one gets the next.
	e.Eventually("the next renewal released to the re-bound connection", func() bool { return again.AdmittedRenewalSequence() == 2 })
	if got := e.Metric("relay_downstream_rebound_total"); got != 1 {
		t.Fatalf("relay_downstream_rebound_total = %v, want 1", got)
	}

	// Any other registration — another instance nonce here — is not Cloudly's to answer while
	// detached.
	other := sim.NewNode("node-a", e.Log)
	other.Bearer, other.Generation = first.Bearer, first.Generation
	if err := other.Connect(ctx, e.URL); err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	_, err = other.Register(ctx)
	wantRefusal(t, err, contracts.RelayUpstreamDetached)
	stranger := e.Dial("node-b")
	_, err = stranger.Register(ctx)
	wantRefusal(t, err, contracts.RelayUpstreamDetached)

	// Attached again, registrations go to Cloudly as always.
	e.Cloudly.SetAvailable(true)
	e.WaitAttached()
	before := e.Cloudly.NodeRegistrations("node-a")
	if _, err := other.Register(ctx); err != nil {
		t.Fatalf("a registration once attached again: %v", err)
	}
	if e.Cloudly.NodeRegistrations("node-a") != before+1 {
		t.Fatal("once attached, the relay answered a registration itself")
	}
}
