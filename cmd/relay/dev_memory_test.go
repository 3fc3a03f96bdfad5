package main

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/internal/sim"
)

// TestDevHeapStaysFlat runs the `relay dev` scenario — the relay and the simulated peers in this
// process — on a fast outage cycle and compares the live heap in the middle of the second outage
// with the live heap in the middle of the eighth: the same point of the cycle, six cycles apart,
// while traffic is quiet. Between them pass some twenty restores and hundreds of grants, requests,
// renewals and streams; whatever the relay or a peer keeps of each shows as growth. Keeping every
// restore control alone (as the Corestore stand-in did) grows the heap by over half. It also
// checks the story repeats: every outage releases renewals from escrow, and every one recovers.
func TestDevHeapStaysFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the relay dev scenario for about half a minute")
	}
	const nodes, first, last = 5, 2, 8
	d, err := startDev(nodes, zerolog.Nop(), "warn")
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	d.sc.Timing = sim.Timing{FirstAttached: time.Second, Attached: 2 * time.Second, Outage: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := d.waitAttached(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.sc.Run(runCtx, "ws://"+d.relay.DownstreamAddr().String()+"/") }()
	defer func() { stopRun(); <-done }()

	heap := map[int64]uint64{}
	for seen := int64(0); seen < last; time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("the scenario stopped after %d outages: %v", seen, err)
		case <-ctx.Done():
			t.Fatalf("only %d outages in 3 minutes: %s", seen, d.sc.Snapshot().Summary())
		default:
		}
		if o := d.sc.Snapshot().Outages; o > seen {
			seen = o
			time.Sleep(d.sc.Timing.Outage / 2)
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			heap[seen] = m.HeapAlloc
			t.Logf("outage %d: live heap %.2f MiB; %s", seen, float64(m.HeapAlloc)/(1<<20), d.sc.Snapshot().Summary())
		}
	}
	// Every outage releases renewals again, at least one to each node: each run Cloudly holds
	// continues the sequences the nodes admitted before.
	if c := d.sc.Snapshot(); c.Restores == 0 || c.Streams == 0 || c.Recoveries < last-1 || c.EscrowReleased < (last-1)*nodes {
		t.Fatalf("the scenario did not run every part in every cycle: %s", c.Summary())
	}
	if a, b := heap[first], heap[last]; b > a+a/5 {
		t.Fatalf("the live heap grew from %.2f MiB in outage %d to %.2f MiB in outage %d: more than 20 %%",
			float64(a)/(1<<20), first, float64(b)/(1<<20), last)
	}
}
