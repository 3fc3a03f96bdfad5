package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/testenv/relaytest"
	"code.foss.global/serve.zone/relay/internal/testenv/sim"
	"code.foss.global/serve.zone/relay/relay"
)

// waitFor polls cond every 10 ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cond()
}

// TestEscrowReleasesThroughTheRelayWhileCloudlyIsDown runs the relay as cmd/relay builds it, with
// the simulated Cloudly and a simulated node over loopback sockets: a run held while attached is
// not released; once Cloudly is cut off the node gets the current window within a second and the
// next one when its slot opens; once Cloudly is back nothing more is released.
func TestEscrowReleasesThroughTheRelayWhileCloudlyIsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the relay for seconds")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	e := relaytest.Start(t, relaytest.Options{
		Build: build, PingInterval: 200 * time.Millisecond, DeadTimeout: time.Second,
		Configure: func(cfg *relay.Config) { cfg.BuildVersion = buildVersion },
	})
	defer e.Close() // before goleak looks
	cloudly, logs := e.Cloudly, e.Logs
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	node := sim.NewNode("node-e2e", e.Log)
	node.AutoReregister = true
	renewals := sim.RecordRenewals(node)
	if err := node.Connect(ctx, e.URL); err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	if _, err := node.Register(ctx); err != nil {
		t.Fatal(err)
	}

	// Twelve 3-second windows, one every 2 seconds: short, as the rules allow.
	run := sim.EscrowRun{Session: node.Session(), Start: time.Now(), Count: 12, Step: 2 * time.Second, Window: 3 * time.Second}
	windows := run.Windows()
	body, err := run.Request()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cloudly.Call(ctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, body)
	if err != nil {
		t.Fatalf("hold: %v", err)
	}
	if err := contracts.BindHoldRuntimeNetworkDnsLeaseRenewalsResponse(resp, 12); err != nil {
		t.Fatalf("hold answer %s: %v", resp, err)
	}

	time.Sleep(700 * time.Millisecond)
	if n := node.Received(contracts.MethodApplyRuntimeNetworkDnsLeaseRenewal); n != 0 {
		t.Fatalf("%d renewals released while attached", n)
	}

	cut := time.Now()
	cloudly.SetAvailable(false)
	if !waitFor(time.Second, func() bool { return len(renewals.Receipts()) >= 1 }) {
		t.Fatalf("no renewal within a second of the cut (logs:\n%s)", logs.String())
	}
	first := renewals.Receipts()[0]
	if first.At.Sub(cut) > time.Second || first.Status != contracts.ApplyStatusAccepted {
		t.Fatalf("first release %+v, %v after the cut", first, first.At.Sub(cut))
	}
	if w := windows[first.Sequence-1]; !w.Current(first.At.UnixMilli()) || first.Sequence != newestCurrent(windows, first.At.UnixMilli()) {
		t.Fatalf("released sequence %d at %d, not the newest current window", first.Sequence, first.At.UnixMilli())
	}

	next := windows[first.Sequence] // the following slot
	if !waitFor(time.Until(time.UnixMilli(next.NotBefore))+time.Second, func() bool { return len(renewals.Receipts()) >= 2 }) {
		t.Fatal("the next window was not released when its slot opened")
	}
	second := renewals.Receipts()[1]
	late := second.At.Sub(time.UnixMilli(next.NotBefore))
	if second.Sequence != first.Sequence+1 || second.Status != contracts.ApplyStatusAccepted || late < 0 || late > 500*time.Millisecond {
		t.Fatalf("second release %+v, %v after its slot opened", second, late)
	}
	t.Logf("cut → sequence %d after %v; sequence %d %v after its slot opened", first.Sequence, first.At.Sub(cut), second.Sequence, late)
	if node.AdmittedRenewalSequence() != second.Sequence {
		t.Fatalf("node admitted %d", node.AdmittedRenewalSequence())
	}

	// Cloudly is back: once the relay is attached again nothing more is released.
	cloudly.SetAvailable(true)
	if !waitFor(30*time.Second, cloudly.Attached) {
		t.Fatal("relay did not re-attach")
	}
	time.Sleep(100 * time.Millisecond) // let the relay record the attach before counting
	released := len(renewals.Receipts())
	now := time.Now().UnixMilli()
	if j := slotAfter(windows, now); j >= 0 {
		time.Sleep(time.Until(time.UnixMilli(windows[j].NotBefore)) + 500*time.Millisecond)
		if got := len(renewals.Receipts()); got != released {
			t.Fatalf("%d renewals released after re-attach", got-released)
		}
	} else {
		t.Log("re-attach came after the run's last slot; nothing left to check")
	}

	// Nothing of a run but node, count, sequences and windows reaches the logs.
	for _, secret := range []string{"sim-signature", "authority-sim", "sha256:", "projection-node-e2e"} {
		if strings.Contains(logs.String(), secret) {
			t.Fatalf("logs mention %q", secret)
		}
	}
	if !strings.Contains(logs.String(), `"component":"escrow"`) {
		t.Fatal("no escrow log line")
	}
}

func newestCurrent(ws []contracts.DnsWindow, now int64) int64 {
	var seq int64
	for i, w := range ws {
		if w.Current(now) {
			seq = int64(i + 1)
		}
	}
	return seq
}

func slotAfter(ws []contracts.DnsWindow, now int64) int {
	for i, w := range ws {
		if w.NotBefore > now+200 {
			return i
		}
	}
	return -1
}
