package daemon

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sync/errgroup"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/escrow"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// waitFor reports whether cond held within d.
func waitFor(d time.Duration, cond func() bool) bool { return await.Within(d, cond) }

// TestEscrowReleasesThroughTheRelayWhileCloudlyIsDown runs the relay as cmd/relay builds it, with
// the simulated Cloudly and a simulated node over loopback sockets: a run held while attached is
// not released; once Cloudly is cut off the node gets the newest current window and then the next
// one, once its slot has opened; once Cloudly is back nothing more is released. How soon a
// release follows its slot is the escrow benchmarks' figure (BenchmarkEscrowReleaseThroughRelay
// here, and the synctest tests of escrow's scheduler pin the instants), not this test's.
func TestEscrowReleasesThroughTheRelayWhileCloudlyIsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the relay for seconds")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	e := relaytest.Start(t, relaytest.Options{
		Build: build, PingInterval: 200 * time.Millisecond, DeadTimeout: time.Second,
		Configure: func(cfg *relay.Config) { cfg.BuildVersion = relay.DefaultBuildVersion },
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

	// The escrow holds the run, its first window current already, and knows the relay attached:
	// it releases nothing (escrow's own tests pin that it never does while attached).
	if !waitFor(10*time.Second, func() bool { st := escrowStatus(t, e.Relay); return st.Runs == 1 && st.Renewals == 12 }) {
		t.Fatalf("the escrow does not report the run held: %+v", escrowStatus(t, e.Relay))
	}
	if st := escrowStatus(t, e.Relay); st.Releasing || st.NextRelease != nil || st.ReleasesWhileDetached != 0 {
		t.Fatalf("the escrow releases while the relay is attached: %+v", st)
	}
	if n := node.Received(contracts.MethodApplyRuntimeNetworkDnsLeaseRenewal); n != 0 {
		t.Fatalf("%d renewals released while attached", n)
	}

	cut := time.Now()
	cloudly.SetAvailable(false)
	if !waitFor(10*time.Second, func() bool { return len(renewals.Receipts()) >= 1 }) {
		t.Fatalf("no renewal after the cut (logs:\n%s)", logs.String())
	}
	first := renewals.Receipts()[0]
	if first.At.Before(cut) {
		t.Fatalf("sequence %d released %v before the cut, while attached", first.Sequence, cut.Sub(first.At))
	}
	if first.Status != contracts.ApplyStatusAccepted {
		t.Fatalf("first release %+v, %v after the cut", first, first.At.Sub(cut))
	}
	if w := windows[first.Sequence-1]; !w.Current(first.At.UnixMilli()) || first.Sequence != newestCurrent(windows, first.At.UnixMilli()) {
		t.Fatalf("released sequence %d at %d, not the newest current window", first.Sequence, first.At.UnixMilli())
	}

	next := windows[first.Sequence] // the following slot
	if !waitFor(time.Until(time.UnixMilli(next.NotBefore))+10*time.Second, func() bool { return len(renewals.Receipts()) >= 2 }) {
		t.Fatal("the next window was not released once its slot opened")
	}
	second := renewals.Receipts()[1]
	late := second.At.Sub(time.UnixMilli(next.NotBefore))
	if second.Sequence != first.Sequence+1 || second.Status != contracts.ApplyStatusAccepted || late < 0 {
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
	if !waitFor(10*time.Second, e.Relay.Upstream().Attached) {
		t.Fatal("the relay did not see itself attached again")
	}
	// The escrow, told the relay is attached again, releases nothing more: it reports itself not
	// releasing, with nothing due (escrow's own tests pin that a slot opening while attached
	// releases nothing).
	if !waitFor(10*time.Second, func() bool { return !escrowStatus(t, e.Relay).Releasing }) {
		t.Fatalf("the escrow still releases after the re-attach: %+v", escrowStatus(t, e.Relay))
	}
	released := len(renewals.Receipts())
	if st := escrowStatus(t, e.Relay); st.NextRelease != nil {
		t.Fatalf("after the re-attach the escrow has a release due: %+v", st)
	}
	if got := len(renewals.Receipts()); got != released {
		t.Fatalf("%d renewals released after re-attach", got-released)
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

// escrowStatus is the escrow's part of the relay's status snapshot.
func escrowStatus(t *testing.T, r *relay.Relay) escrow.Status {
	t.Helper()
	for _, p := range r.Snapshot(time.Now()).Parts {
		if st, ok := p.Status.(escrow.Status); ok {
			return st
		}
	}
	t.Fatal("no escrow part in the relay's status")
	return escrow.Status{}
}

// A node that rotates after Cloudly handed the relay its run (a new session binding in the same
// scope) gets the released renewal under the new binding: the node refuses a push under a
// binding that is not its current one (docs/escrow.md, bindApplyRuntimeNetworkDnsLeaseRenewalRequest).
func TestEscrowReleasesUnderTheSessionTheNodeRotatedTo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the relay for seconds")
	}
	e := relaytest.Start(t, relaytest.Options{
		Build: build, PingInterval: 200 * time.Millisecond, DeadTimeout: time.Second,
		Configure: func(cfg *relay.Config) { cfg.BuildVersion = relay.DefaultBuildVersion },
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

// BenchmarkEscrowReleaseThroughRelay measures escrow release over real sockets: N simulated nodes
// (ESCROW_BENCH_NODES, default 1000) registered through a relay built as cmd/relay builds it, one
// run each whose slots open for every node at the same instant, Cloudly cut off, and the delay
// from each slot opening to the node receiving the renewal, over three slots. Run it once:
// -bench EscrowReleaseThroughRelay -benchtime 1x.
func BenchmarkEscrowReleaseThroughRelay(b *testing.B) {
	nodes := 1000
	if s := os.Getenv("ESCROW_BENCH_NODES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("ESCROW_BENCH_NODES=%q", s)
		}
		nodes = n
	}
	for range b.N {
		benchEscrowThroughRelay(b, nodes)
	}
}

func benchEscrowThroughRelay(b *testing.B, nodes int) {
	e := relaytest.Start(b, relaytest.Options{Build: build, Quiet: true,
		Configure: func(cfg *relay.Config) { cfg.BuildVersion = relay.DefaultBuildVersion }})
	defer e.Close()
	cloudly, log, url := e.Cloudly, e.Log, e.URL
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	sims := make([]*sim.Node, nodes)
	counters := make([]*sim.RenewalCounter, nodes)
	var g errgroup.Group
	g.SetLimit(32)
	for i := range sims {
		sims[i] = sim.NewNode(fmt.Sprintf("node-%05d", i), log)
		sims[i].AutoReregister = false
		counters[i] = sim.RecordRenewals(sims[i])
		g.Go(func() error {
			if err := sims[i].Connect(ctx, url); err != nil {
				return err
			}
			rctx, rcancel := context.WithTimeout(ctx, time.Minute)
			defer rcancel()
			_, err := sims[i].Register(rctx)
			return err
		})
	}
	defer func() {
		for _, n := range sims {
			if n.Conn() != nil {
				n.Close()
			}
		}
	}()
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}

	const step, bursts = 2 * time.Second, 3
	t0 := time.Now().Add(2*time.Second + time.Duration(nodes)*time.Millisecond).Truncate(time.Second)
	for _, n := range sims {
		body, err := sim.EscrowRun{Session: n.Session(), Start: t0, Count: bursts + 1, Step: step, Window: 3 * time.Second}.Request()
		if err != nil {
			b.Fatal(err)
		}
		resp, err := cloudly.Call(ctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, body)
		if err != nil || contracts.BindHoldRuntimeNetworkDnsLeaseRenewalsResponse(resp, bursts+1) != nil {
			b.Fatalf("hold: %s %v", resp, err)
		}
	}
	if time.Until(t0) < 300*time.Millisecond {
		b.Fatalf("holding took too long: t0 is %v away", time.Until(t0))
	}
	cloudly.SetAvailable(false)
	// The releases due in the window, up to half a step before the next slot: every node's three
	// admitted, or the window's end (the counts below then say what was missing). Each delay is
	// read from its node's receipt, not from this wait.
	await.Within(time.Until(t0.Add(bursts*step-step/2)), func() bool {
		for _, c := range counters {
			if c.Admitted() < bursts {
				return false
			}
		}
		return true
	})

	var delays []time.Duration
	admitted := 0
	for _, c := range counters {
		for _, rc := range c.Receipts() {
			delays = append(delays, rc.At.Sub(t0.Add(time.Duration(rc.Sequence-1)*step)))
			if rc.Status == contracts.ApplyStatusAccepted {
				admitted++
			}
		}
	}
	if len(delays) != nodes*bursts || admitted != nodes*bursts {
		b.Fatalf("%d pushes, %d admitted; want %d", len(delays), admitted, nodes*bursts)
	}
	slices.Sort(delays)
	p := func(q float64) float64 {
		return float64(delays[int(q*float64(len(delays)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(p(0.50), "p50-ms")
	b.ReportMetric(p(0.99), "p99-ms")
	b.ReportMetric(p(1), "max-ms")
	b.ReportMetric(float64(nodes), "nodes")
}
