package main

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/internal/testenv/sim"
)

// TestDevHeapStaysFlat runs the `relay dev` scenario — the relay and the simulated peers in this
// process — on a fast outage cycle and compares the live heap in the middle of the second outage
// with the live heap in the middle of a later one (the same point of the cycle, while traffic is
// quiet): at least six cycles and twelve restores later, with hundreds of grants, requests,
// renewals and streams between. Whatever the relay or a peer keeps of each of them shows as growth;
// what the peers keep by design is bounded (the staging of 16 restores, a stream cut by an outage
// for a minute) and stays under the 2 MiB allowed. Keeping every restore control alone, as the
// Corestore stand-in did, grows it by over 3 MiB. The test also checks that the story repeats:
// every outage releases renewals and every one recovers.
func TestDevHeapStaysFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the relay dev scenario for about half a minute")
	}
	const (
		nodes        = 5
		first        = 2       // the outage the heap is first read in: after the warm-up
		cycles       = 6       // at least this many outages later
		restores     = 12      // and at least this many restores later
		allowedBytes = 2 << 20 // growth allowed between the two
	)
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

	var firstHeap uint64
	var firstCounts sim.Counts
	for seen := int64(0); ; time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("the scenario stopped after %d outages: %v", seen, err)
		case <-ctx.Done():
			t.Fatalf("not enough outages or restores in 3 minutes: %s", d.sc.Snapshot().Summary())
		default:
		}
		if d.sc.Snapshot().Outages <= seen {
			continue
		}
		seen++
		if seen < first {
			continue
		}
		time.Sleep(d.sc.Timing.Outage / 2)
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		c := d.sc.Snapshot()
		t.Logf("outage %d: live heap %.2f MiB; %s", seen, float64(m.HeapAlloc)/(1<<20), c.Summary())
		if seen == first {
			firstHeap, firstCounts = m.HeapAlloc, c
			continue
		}
		if seen < first+cycles || c.Restores < firstCounts.Restores+restores {
			continue
		}
		// Every outage releases renewals again, at least one to each node: each run Cloudly holds
		// continues the sequences the nodes admitted before.
		if c.Recoveries < seen-1 || c.EscrowReleased-firstCounts.EscrowReleased < (seen-first)*nodes || c.Streams == firstCounts.Streams {
			t.Fatalf("the scenario did not run every part in every cycle: %s, after outage %d: %s", c.Summary(), first, firstCounts.Summary())
		}
		if m.HeapAlloc > firstHeap+allowedBytes {
			t.Fatalf("the live heap grew by %.2f MiB, from %.2f MiB in outage %d to %.2f MiB in outage %d: more than %d MiB",
				float64(m.HeapAlloc-firstHeap)/(1<<20), float64(firstHeap)/(1<<20), first, float64(m.HeapAlloc)/(1<<20), seen, allowedBytes>>20)
		}
		return
	}
}
