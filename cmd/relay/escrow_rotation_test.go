package main

import (
	"context"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/testenv/relaytest"
	"code.foss.global/serve.zone/relay/internal/testenv/sim"
	"code.foss.global/serve.zone/relay/relay"
)

// A node that rotates after Cloudly handed the relay its run (a new session binding in the same
// scope) gets the released renewal under the new binding: the node refuses a push under a
// binding that is not its current one (SPEC §6, bindApplyRuntimeNetworkDnsLeaseRenewalRequest).
func TestEscrowReleasesUnderTheSessionTheNodeRotatedTo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the relay for seconds")
	}
	e := relaytest.Start(t, relaytest.Options{
		Build: build, PingInterval: 200 * time.Millisecond, DeadTimeout: time.Second,
		Configure: func(cfg *relay.Config) { cfg.BuildVersion = buildVersion },
	})
	defer e.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node := sim.NewNode("node-rot", e.Log)
	renewals := sim.RecordRenewals(node)
	if err := node.Connect(ctx, e.URL); err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	if _, err := node.Register(ctx); err != nil {
		t.Fatal(err)
	}
	body, err := sim.EscrowRun{Session: node.Session(), Start: time.Now(), Count: 12, Step: 2 * time.Second, Window: 3 * time.Second}.Request()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Cloudly.Call(ctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, body); err != nil {
		t.Fatalf("hold: %v", err)
	}
	old := string(node.Session())
	node.Generation++
	if _, err := node.Register(ctx); err != nil {
		t.Fatalf("rotation: %v", err)
	}
	if string(node.Session()) == old {
		t.Fatal("rotation kept the binding")
	}
	e.Cloudly.SetAvailable(false)
	if !waitFor(3*time.Second, func() bool { return renewals.Admitted() >= 1 }) {
		t.Fatalf("nothing admitted after the cut: receipts %+v", renewals.Receipts())
	}
}
