package relay_test

import (
	"sync"
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
// relay-upstream-detached (docs/escrow.md).
func TestDetachedRebinding(t *testing.T) {
	t.Parallel() // most of its time is waiting for the relay's re-dial and the node's push retries
	// The renewal windows are read on one test clock, by the escrow and by the node stand-ins, so
	// that the second window opens when the test says, not 10 s of wall clock later: a busy
	// machine cannot make the test miss it, and the test does not wait for it.
	clk := newTestClock(time.Now())
	var esc *escrow.Escrow
	e := relaytest.Start(t, relaytest.Options{Build: func(cfg relay.Config, o relay.Options) (*relay.Relay, error) {
		var err error
		if esc, err = escrow.New(escrow.Options{Now: clk.Now, Registerer: o.Registry, Logger: o.Logger}); err != nil {
			return nil, err
		}
		return relay.New(cfg, relay.Features{Parts: []relay.Part{{Name: "escrow", Impl: esc}}}, o)
	}})
	ctx := ctxHung(t)

	first := sim.NewNode("node-a", e.Log)
	first.Now = clk.UnixMilli
	if err := first.Connect(ctx, e.URL); err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if _, err := first.Register(ctx); err != nil {
		t.Fatal(err)
	}
	answer := e.Cloudly.Session("node-a")
	// The first slot is current now; the second opens 10 s later on the test clock.
	run := sim.EscrowRun{Session: first.Session(), Start: clk.Now().Add(-50 * time.Second), Count: 4, Step: time.Minute, Window: 2 * time.Minute}
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
	e.Eventually("the escrow heard the acknowledgement", func() bool {
		return e.Metric("relay_escrow_releases_total", "outcome", "accepted") == 1
	})

	// The node's socket drops; it comes back as it was, same credential and instance nonce, once
	// the second window has opened.
	first.Close()
	e.Eventually("the escrow no longer carries the first connection", func() bool { return !escrowCarries(esc) })
	clk.Advance(11 * time.Second)
	again := sim.NewNode("node-a", e.Log)
	again.Nonce, again.Bearer, again.Generation, again.Now = first.Nonce, first.Bearer, first.Generation, clk.UnixMilli
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
	// The node acknowledged renewal 1 on its first connection: the re-bound one gets the next. A
	// push that reaches the node before it has read its registration's answer is refused and
	// retried a second later: the clock moves on as the test waits, 0.1 s a look, up to 150 s past
	// the first slot's start (the second window ends 180 s past it), however long the looking
	// takes on a busy machine.
	last := run.Start.Add(150 * time.Second)
	e.Eventually("the next renewal released to the re-bound connection", func() bool {
		if clk.Now().Before(last) {
			clk.Advance(100 * time.Millisecond)
		}
		return again.AdmittedRenewalSequence() == 2
	})
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
	// The rebound session's own registration on the new attach may land on either side of
	// before: at least one more, never none.
	if e.Cloudly.NodeRegistrations("node-a") < before+1 {
		t.Fatal("once attached, the relay answered a registration itself")
	}
}

// testClock is a clock the test moves: Now and UnixMilli read it, Advance moves it on.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock(t time.Time) *testClock { return &testClock{now: t} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) UnixMilli() int64 { return c.Now().UnixMilli() }

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// escrowCarries is whether the escrow carries a session of its one node.
func escrowCarries(esc *escrow.Escrow) bool {
	st := esc.Status().(escrow.Status)
	return len(st.Nodes) == 1 && st.Nodes[0].Carried
}
