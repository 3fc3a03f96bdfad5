package escrow

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestStatusShowsRunsPerNodeAndTheNextRelease: two nodes' runs, attached then detached, a node
// leaving and custody ending, as the status page sees them.
func TestStatusShowsRunsPerNodeAndTheNextRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := startBubble(t)
		defer b.stop()
		a := newFakeNode("node-a", cloudlyA, "rt-cluster-a", 1)
		bn := newFakeNode("node-b", cloudlyA, "rt-cluster-a", 1)
		b.e.Attached(nil)
		b.e.NodeBound(a)
		b.e.NodeBound(bn)
		now := nowMs()
		startA, startB := now-minute, now+5*minute
		for _, spec := range []runSpec{gridRun("node-a", 23, startA), gridRun("node-b", 5, startB)} {
			if _, err := b.e.Hold(true, spec.body(t)); err != nil {
				t.Fatal(err)
			}
		}
		at := func(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

		// Attached: both runs held, nothing is released, so no next release.
		st := b.status(t)
		if st.Runs != 2 || st.Renewals != 28 || st.Releasing || st.NextRelease != nil || count(b.e.metrics.holds, "held") != 2 {
			t.Fatalf("attached: %+v", st)
		}
		if len(st.Nodes) != 2 || st.Nodes[0].Node != "node-a" || st.Nodes[0].Renewals != 23 || !st.Nodes[0].Carried ||
			st.Nodes[1].Node != "node-b" || st.Nodes[1].Renewals != 5 {
			t.Fatalf("nodes: %+v", st.Nodes)
		}
		if got := st.Nodes[0].NextSlot; got == nil || !got.Equal(at(startA+10*minute)) {
			t.Fatalf("node-a's next slot %v, want %v", got, at(startA+10*minute))
		}
		if got := st.Nodes[1].NextSlot; got == nil || !got.Equal(at(startB)) {
			t.Fatalf("node-b's next slot %v, want %v", got, at(startB))
		}
		if want := at(startA + 22*10*minute + 15*minute); !st.Nodes[0].HeldUntil.Equal(want) {
			t.Fatalf("node-a held until %v, want %v", st.Nodes[0].HeldUntil, want)
		}

		// Detached: node-a's current renewal goes at once; the next push due is node-b's first slot.
		b.e.Detached()
		synctest.Wait()
		st = b.status(t)
		if !st.Releasing || st.ReleasesWhileDetached != 1 || count(b.e.metrics.releases, outcomeAccepted) != 1 {
			t.Fatalf("detached: %+v", st)
		}
		if st.NextRelease == nil || !st.NextRelease.Equal(at(startB)) {
			t.Fatalf("next release %v, want node-b's first slot %v", st.NextRelease, at(startB))
		}

		// node-b's connection ends: nothing can reach it, so the next release is node-a's next slot.
		bn.end()
		synctest.Wait()
		st = b.status(t)
		if st.Nodes[1].Carried || st.NextRelease == nil || !st.NextRelease.Equal(at(startA+10*minute)) {
			t.Fatalf("node-b gone: next release %v, nodes %+v", st.NextRelease, st.Nodes)
		}
		sleepUntil(startA + 10*minute)
		if st = b.status(t); st.ReleasesWhileDetached != 2 || count(b.e.metrics.releases, outcomeAccepted) != 2 {
			t.Fatalf("after node-a's second slot: %+v", st)
		}

		b.e.CustodyEnded()
		st = b.status(t)
		if st.Runs != 0 || st.Renewals != 0 || len(st.Nodes) != 0 || st.NextRelease != nil || count(b.e.metrics.dropped, dropCustody) != 2 {
			t.Fatalf("after custody ended: %+v", st)
		}
		a.end()
	})
}

// count is one series of a counter the status page lists beside the escrow's status.
func count(v *prometheus.CounterVec, label string) float64 {
	return testutil.ToFloat64(v.WithLabelValues(label))
}

// TestStatusListsTheBusiest100 bounds the page: 120 nodes holding runs, the 100 holding the most
// renewals listed.
func TestStatusListsTheBusiest100(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := startBubble(t)
		defer b.stop()
		b.e.Attached(nil)
		start := nowMs()
		for i := range 120 {
			id := fmt.Sprintf("node-%03d", i)
			n := newFakeNode(id, cloudlyA, "rt-cluster-a", 1)
			defer n.end()
			b.e.NodeBound(n)
			if _, err := b.e.Hold(true, gridRun(id, 1+i%12, start).body(t)); err != nil {
				t.Fatal(err)
			}
		}
		st := b.status(t)
		if st.Runs != 120 || len(st.Nodes) != 100 || st.Nodes[0].Renewals != 12 || st.Nodes[0].Node != "node-011" {
			t.Fatalf("%d runs, %d listed, first %+v", st.Runs, len(st.Nodes), st.Nodes[0])
		}
		for i := 1; i < len(st.Nodes); i++ {
			if st.Nodes[i].Renewals > st.Nodes[i-1].Renewals {
				t.Fatalf("row %d holds more than row %d: %+v", i, i-1, st.Nodes[i-1:i+1])
			}
		}
	})
}

// status is the escrow's Status, checked to marshal without a renewal's contents: no signature,
// controller or namespace of the runs held.
func (b *bubble) status(t *testing.T) Status {
	t.Helper()
	st, ok := b.e.Status().(Status)
	if !ok {
		t.Fatalf("Status() is a %T", b.e.Status())
	}
	out, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"sig-", "cloudly-a", "rt-cluster-a", "sha256:", "projection-"} {
		if strings.Contains(string(out), secret) {
			t.Fatalf("the status shows %q: %s", secret, out)
		}
	}
	return st
}
