package escrow

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"code.foss.global/serve.zone/relay/contracts"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bubble is an Escrow running in a synctest bubble: time is fake, Run is live.
type bubble struct {
	e      *Escrow
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{}
}

func startBubble(t *testing.T) *bubble {
	reg := prometheus.NewRegistry()
	e, err := New(Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &bubble{e: e, reg: reg, cancel: cancel, done: make(chan struct{})}
	go func() { e.Run(ctx); close(b.done) }()
	return b
}

func (b *bubble) stop() {
	b.cancel()
	<-b.done
}

func nowMs() int64 { return time.Now().UnixMilli() }

// sleepUntil sleeps until the Unix ms instant at, then lets the bubble settle.
func sleepUntil(at int64) {
	time.Sleep(time.Until(time.UnixMilli(at))) // the bubble's fake clock: time passing is what these tests test
	synctest.Wait()
}

func TestReleaseOnlyWhileDetachedOnTheSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := startBubble(t)
		defer b.stop()
		node := newFakeNode("node-a", cloudlyA, "rt-cluster-a", 1)
		b.e.Attached(nil)
		b.e.NodeBound(node)
		start := nowMs() - minute
		spec := gridRun("node-a", 23, start)
		req := spec.read(t)
		if _, err := b.e.Hold(true, spec.body(t)); err != nil {
			t.Fatal(err)
		}
		// Attached: nothing is released, however many slots open.
		sleepUntil(start + 31*minute)
		if got := node.received(); len(got) != 0 {
			t.Fatalf("released %d renewals while attached", len(got))
		}
		// Cut off from Cloudly at minute 31: the newest current window (slot 30, sequence 4) goes now.
		b.e.Detached()
		synctest.Wait()
		calls := node.received()
		if len(calls) != 1 || calls[0].method != contracts.MethodApplyRuntimeNetworkDnsLeaseRenewal || calls[0].seq != 4 {
			t.Fatalf("on detach: %+v", calls)
		}
		// The push carries the node's own binding and the envelope Cloudly sent, untouched.
		want := contracts.AppendApplyRuntimeNetworkDnsLeaseRenewalRequest(nil, node.Session().Raw, req.Renewals[3].Raw)
		if string(calls[0].body) != string(want) {
			t.Fatalf("apply body\n%s\nwant\n%s", calls[0].body, want)
		}
		// The next slot: sequence 5 exactly when its window opens, never before.
		sleepUntil(start + 40*minute - 1)
		if len(node.received()) != 1 {
			t.Fatal("released before the slot opened")
		}
		sleepUntil(start + 40*minute)
		calls = node.received()
		if len(calls) != 2 || calls[1].seq != 5 || calls[1].at.UnixMilli() != start+40*minute {
			t.Fatalf("at the next slot: %+v", calls)
		}
		// Re-attached: release stops mid-run.
		b.e.Attached(nil)
		sleepUntil(start + 90*minute)
		if len(node.received()) != 2 {
			t.Fatalf("released after re-attach: %v", node.sequences())
		}
		if got := testutil.ToFloat64(b.e.metrics.releases.WithLabelValues(outcomeAccepted)); got != 2 {
			t.Fatalf("releases_total{accepted} = %v", got)
		}
		// Both pushes went the instant they were due: on detach, and on the slot.
		if n, sum := histogram(t, b.reg, "relay_escrow_release_delay_seconds"); n != 2 || sum != 0 {
			t.Fatalf("release delay: %d observations summing %v s, want 2 of 0 s", n, sum)
		}
	})
}

// TestReconnectedNodeGetsWhatItDidNotAcknowledge: a node that comes back on a new connection gets
// the current renewal again if it never acknowledged it, and never one it did.
func TestReconnectedNodeGetsWhatItDidNotAcknowledge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := startBubble(t)
		defer b.stop()
		first := newFakeNode("-node", cloudlyA, "rt-cluster-a", 1)
		first.hold = true // it never answers: nothing is acknowledged on it
		b.e.Attached(nil)
		b.e.NodeBound(first)
		start := nowMs()
		if _, err := b.e.Hold(true, gridRun("-node", 23, start).body(t)); err != nil {
			t.Fatal(err)
		}
		b.e.Detached()
		synctest.Wait()
		if !slices.Equal(first.sequences(), []int64{1}) {
			t.Fatalf("first connection got %v", first.sequences())
		}
		first.end() // the connection ends: escrow follows its context
		sleepUntil(start + 3*minute)
		second := newFakeNode("-node", cloudlyA, "rt-cluster-a", 2)
		b.e.NodeBound(second)
		synctest.Wait()
		if !slices.Equal(second.sequences(), []int64{1}) || len(first.received()) != 1 {
			t.Fatalf("after reconnect: first %v second %v", first.sequences(), second.sequences())
		}
		if body := second.received()[0].body; !contains(body, second.Session().Raw) {
			t.Fatal("re-push does not carry the new session binding")
		}
		// The second connection acknowledged it: a third is not pushed it again. A superseded
		// connection's end changes nothing; the new one is bound and carries on.
		third := newFakeNode("-node", cloudlyA, "rt-cluster-a", 3)
		b.e.NodeBound(third)
		synctest.Wait()
		if got := third.sequences(); len(got) != 0 {
			t.Fatalf("pushed %v again, which the node acknowledged on its previous connection", got)
		}
		second.end() // late, for a connection no longer carrying the node: ignored
		sleepUntil(start + 10*minute)
		if !slices.Equal(third.sequences(), []int64{2}) || len(second.received()) != 1 {
			t.Fatalf("third %v second %v", third.sequences(), second.sequences())
		}
	})
}

// The escrow follows a node connection's end through its context (relay.Node.Context): once it
// ends, nothing more is pushed on it and the node is carried by no one, a rotation on the same
// connection included.
func TestEndedConnectionCarriesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := startBubble(t)
		defer b.stop()
		node := newFakeNode("node-a", cloudlyA, "rt-cluster-a", 1)
		b.e.Attached(nil)
		b.e.NodeBound(node)
		// The node rotates on the same connection: a new session, the same connection and end.
		rotated := newFakeNode("node-a", cloudlyA, "rt-cluster-a", 2)
		rotated.id, rotated.ctx, rotated.end = node.id, node.ctx, node.end
		b.e.NodeBound(rotated)
		start := nowMs()
		if _, err := b.e.Hold(true, gridRun("node-a", 23, start).body(t)); err != nil {
			t.Fatal(err)
		}
		b.e.Detached()
		synctest.Wait()
		if !slices.Equal(rotated.sequences(), []int64{1}) {
			t.Fatalf("on detach: %v", rotated.sequences())
		}
		node.end()
		synctest.Wait()
		b.e.mu.Lock()
		_, carried := b.e.sched.carrier("node-a")
		b.e.mu.Unlock()
		if carried {
			t.Fatal("an ended connection still carries node-a")
		}
		sleepUntil(start + 30*minute)
		if got := rotated.sequences(); len(got) != 1 || len(node.received()) != 0 {
			t.Fatalf("pushed on an ended connection: %v", got)
		}
	})
}

// nodeError is a node's own error, named like a typedsocket error.
type nodeError struct{ name contracts.RefusalName }

func (e *nodeError) Error() string               { return string(e.name) + ": not now" }
func (e *nodeError) Name() contracts.RefusalName { return e.name }

func TestFailedRefusedAndMismatchedPushesAreCountedAndRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := startBubble(t)
		defer b.stop()
		node := newFakeNode("node-a", cloudlyA, "rt-cluster-a", 1)
		b.e.Attached(nil)
		b.e.NodeBound(node)
		start := nowMs()
		if _, err := b.e.Hold(true, gridRun("node-a", 3, start).body(t)); err != nil {
			t.Fatal(err)
		}
		answers := []func(json.RawMessage) (json.RawMessage, error){
			func(json.RawMessage) (json.RawMessage, error) {
				return nil, contracts.RelayNodeBusy.Refuse("queue full")
			},
			func(json.RawMessage) (json.RawMessage, error) { return nil, &nodeError{"renewal-not-current"} },
			func(body json.RawMessage) (json.RawMessage, error) {
				resp, _ := admit(body)
				return json.RawMessage(replaceOnce(string(resp), `"sequence":1`, `"sequence":2`)), nil
			},
			func(body json.RawMessage) (json.RawMessage, error) {
				resp, _ := admit(body)
				return json.RawMessage(replaceOnce(string(resp), `"accepted"`, `"replay"`)), nil
			},
		}
		i := 0
		node.setAnswer(func(body json.RawMessage) (json.RawMessage, error) {
			a := answers[min(i, len(answers)-1)]
			i++
			return a(body)
		})
		b.e.Detached()
		synctest.Wait()
		sleepUntil(start + 1000 + 2000 + 4000)
		calls := node.received()
		if len(calls) != 4 {
			t.Fatalf("%d pushes, want the first and three retries", len(calls))
		}
		for k, wantGap := range []int64{1000, 2000, 4000} {
			if gap := calls[k+1].at.UnixMilli() - calls[k].at.UnixMilli(); gap != wantGap {
				t.Fatalf("retry %d after %d ms, want %d", k+1, gap, wantGap)
			}
		}
		for outcome, want := range map[string]float64{outcomeFailed: 1, outcomeRefused: 1, outcomeMismatch: 1, outcomeReplay: 1, outcomeAccepted: 0} {
			if got := testutil.ToFloat64(b.e.metrics.releases.WithLabelValues(outcome)); got != want {
				t.Errorf("releases_total{%s} = %v, want %v", outcome, got, want)
			}
		}
		// Replay binds: the renewal is acknowledged and not pushed again in this session.
		sleepUntil(start + 9*minute)
		if len(node.received()) != 4 {
			t.Fatalf("pushed again after a replay: %v", node.sequences())
		}
	})
}

func TestBurstLargerThanABatchReachesEveryNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := startBubble(t)
		defer b.stop()
		b.e.Attached(nil)
		start := nowMs() + minute
		nodes := make([]*fakeNode, 3*releaseBatch+7)
		for i := range nodes {
			id := "node-" + itoa(i)
			nodes[i] = newFakeNode(id, cloudlyA, "rt-cluster-a", 1)
			b.e.NodeBound(nodes[i])
			if _, err := b.e.Hold(true, gridRun(id, 3, start).body(t)); err != nil {
				t.Fatal(err)
			}
		}
		b.e.Detached()
		sleepUntil(start)
		for _, n := range nodes {
			if calls := n.received(); len(calls) != 1 || calls[0].seq != 1 || calls[0].at.UnixMilli() != start {
				t.Fatalf("%s got %+v", n.session.NodeID, calls)
			}
		}
	})
}

// asyncNode answers every push from a goroutine of its own, as a connection's reader does.
type asyncNode struct{ *fakeNode }

func (n asyncNode) Call(method string, body json.RawMessage, done func(json.RawMessage, error)) {
	n.fakeNode.Call(method, body, func(resp json.RawMessage, err error) { go done(resp, err) })
}

func TestAnswersFromManyGoroutinesAcrossSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := startBubble(t)
		defer b.stop()
		b.e.Attached(nil)
		start := nowMs() + minute
		nodes := make([]*fakeNode, 2*releaseBatch+3)
		for i := range nodes {
			id := "node-" + itoa(i)
			nodes[i] = newFakeNode(id, cloudlyA, "rt-cluster-a", 1)
			b.e.NodeBound(asyncNode{nodes[i]})
			if _, err := b.e.Hold(true, gridRun(id, 4, start).body(t)); err != nil {
				t.Fatal(err)
			}
		}
		b.e.Detached()
		sleepUntil(start + 30*minute + 1)
		for _, n := range nodes {
			if got := n.sequences(); !slices.Equal(got, []int64{1, 2, 3, 4}) {
				t.Fatalf("%s got %v, want each renewal once", n.session.NodeID, got)
			}
		}
		if got := testutil.ToFloat64(b.e.metrics.releases.WithLabelValues(outcomeAccepted)); got != float64(4*len(nodes)) {
			t.Fatalf("releases_total{accepted} = %v, want %d", got, 4*len(nodes))
		}
	})
}

func TestRunDroppedWhenItsLastWindowEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := startBubble(t)
		defer b.stop()
		b.e.Attached(nil)
		b.e.NodeBound(newFakeNode("node-a", cloudlyA, "rt-cluster-a", 1))
		start := nowMs()
		if _, err := b.e.Hold(true, gridRun("node-a", 2, start).body(t)); err != nil {
			t.Fatal(err)
		}
		sleepUntil(start + 25*minute - 1)
		if got := testutil.ToFloat64(b.e.metrics.runs); got != 1 {
			t.Fatalf("runs before the last window ends = %v", got)
		}
		sleepUntil(start + 25*minute)
		if r, n := testutil.ToFloat64(b.e.metrics.runs), testutil.ToFloat64(b.e.metrics.renewals); r != 0 || n != 0 {
			t.Fatalf("after the last window: runs %v renewals %v", r, n)
		}
		if got := testutil.ToFloat64(b.e.metrics.dropped.WithLabelValues(dropExpired)); got != 1 {
			t.Fatalf("runs_dropped_total{expired} = %v", got)
		}
	})
}

func TestCustodyEndedDropsEveryRunAndStopsRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := startBubble(t)
		defer b.stop()
		node := newFakeNode("node-a", cloudlyA, "rt-cluster-a", 1)
		b.e.Attached(nil)
		b.e.NodeBound(node)
		start := nowMs() + minute
		if _, err := b.e.Hold(true, gridRun("node-a", 5, start).body(t)); err != nil {
			t.Fatal(err)
		}
		b.e.Detached() // the registration is then refused relay-node-foreign
		b.e.CustodyEnded()
		sleepUntil(start + 30*minute)
		if len(node.received()) != 0 || testutil.ToFloat64(b.e.metrics.runs) != 0 {
			t.Fatalf("after custody ended: %v released, %v runs", node.sequences(), testutil.ToFloat64(b.e.metrics.runs))
		}
	})
}

func TestMetricNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(Options{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	sort.Strings(names)
	want := []string{
		"relay_escrow_digest_unverified_total",
		"relay_escrow_holds_total",
		"relay_escrow_release_delay_seconds",
		"relay_escrow_releases_total",
		"relay_escrow_renewals_held",
		"relay_escrow_runs_dropped_total",
		"relay_escrow_runs_held",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("metrics %q\nwant    %q", names, want)
	}
	// Registering twice in one registry is an error, not a panic.
	if _, err := New(Options{Registerer: reg}); err == nil {
		t.Fatal("second escrow registered the same metrics")
	}
}

func TestRunReturnsWhenItsContextEnds(t *testing.T) {
	e, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	e.Detached()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
	}
	// Answers arriving after Run ended are harmless.
	e.answered(release{nodeID: "x", run: gridRun("x", 1, slot0).held(t)}, nil, errors.New("late"))
}

func histogram(t *testing.T, reg *prometheus.Registry, name string) (uint64, float64) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			h := f.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0, 0
}

func contains(haystack, needle []byte) bool { return len(needle) > 0 && indexOf(haystack, needle) >= 0 }

func indexOf(h, n []byte) int {
	for i := 0; i+len(n) <= len(h); i++ {
		if string(h[i:i+len(n)]) == string(n) {
			return i
		}
	}
	return -1
}

func replaceOnce(s, old, new string) string {
	if i := indexOf([]byte(s), []byte(old)); i >= 0 {
		return s[:i] + new + s[i+len(old):]
	}
	return s
}

// fakeTenure is the relay's tenure as a test sets it.
type fakeTenure struct{ held atomic.Bool }

func (f *fakeTenure) Held() bool { return f.held.Load() }

// TestReleaseAsksTheTenureFirst: a relay whose tenure has ended — before anything fenced it, as
// when a stopped process resumes — pushes nothing, however due; the push counts as failed and
// stays due, and goes once the tenure holds again.
func TestReleaseAsksTheTenureFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := startBubble(t)
		defer b.stop()
		tn := &fakeTenure{}
		b.e.UseTenure(tn)
		node := newFakeNode("node-a", cloudlyA, "rt-cluster-a", 1)
		b.e.Attached(nil)
		b.e.NodeBound(node)
		start := nowMs() - minute
		if _, err := b.e.Hold(true, gridRun("node-a", 23, start).body(t)); err != nil {
			t.Fatal(err)
		}
		b.e.Detached()
		synctest.Wait()
		if got := node.received(); len(got) != 0 {
			t.Fatalf("released %d renewals past the tenure", len(got))
		}
		if got := testutil.ToFloat64(b.e.metrics.releases.WithLabelValues(outcomeFailed)); got < 1 {
			t.Fatalf("releases_total{failed} = %v, want the refused push counted", got)
		}
		tn.held.Store(true)
		sleepUntil(start + 10*minute) // the next slot opens: the due renewal goes
		if calls := node.received(); len(calls) == 0 {
			t.Fatal("nothing released once the tenure held again")
		}
	})
}
