package escrow

import (
	"slices"
	"testing"
)

// The scheduler is driven here on a fake clock: now is an argument, nothing sleeps, nothing is
// sent. Each test plays the node's answers itself through result.

type schedFixture struct {
	t       *testing.T
	s       *scheduler
	node    *fakeNode
	drops   []string
	pushed  []release
	history []int64 // sequences pushed, in order
}

func newSchedFixture(t *testing.T, node string) *schedFixture {
	f := &schedFixture{t: t, node: newFakeNode(node, cloudlyA, "rt-cluster-a", 1)}
	f.s = newScheduler(func(_ string, _ *heldRun, why string) { f.drops = append(f.drops, why) })
	f.bind(f.node, slot0-time0)
	return f
}

const time0 = 60 * minute // fixtures bind an hour before slot0

func (f *schedFixture) bind(n *fakeNode, now int64) bool {
	s := n.Session()
	return f.s.bound(s.NodeID, n, n.ID(), s.Raw, []byte(`{"id":"cloudly-a","kind":"cloudly"}`), s.RuntimeNamespace, now)
}

// at runs the scheduler at now and returns the sequences released, checking each is current and
// the newest current renewal of its run.
func (f *schedFixture) at(now int64) []int64 {
	f.t.Helper()
	var seqs []int64
	for _, r := range f.s.releases(now, 0) {
		rn := r.run.renewals[r.idx]
		if !(rn.notBefore <= now && now < rn.expiresAt) {
			f.t.Fatalf("at %d released sequence %d whose window %d..%d is not current", now-slot0, rn.sequence, rn.notBefore-slot0, rn.expiresAt-slot0)
		}
		if r.idx != r.run.current(now) {
			f.t.Fatalf("at %d released sequence %d, not the newest current one", now-slot0, rn.sequence)
		}
		f.pushed = append(f.pushed, r)
		f.history = append(f.history, rn.sequence)
		seqs = append(seqs, rn.sequence)
	}
	return seqs
}

// answerAll answers every outstanding push, ok or not.
func (f *schedFixture) answerAll(ok bool, now int64) {
	pushed := f.pushed
	f.pushed = nil
	for _, r := range pushed {
		f.s.result(r, ok, now)
	}
}

func (f *schedFixture) next() int64 {
	f.t.Helper()
	at, ok := f.s.next()
	if !ok {
		f.t.Fatal("scheduler has nothing due")
	}
	return at
}

func TestOverlappingWindowsReleaseTheNewestCurrent(t *testing.T) {
	f := newSchedFixture(t, "node-a")
	f.s.hold("node-a", gridRun("node-a", 23, slot0).held(t), slot0-time0)
	f.s.setAttached(false, slot0-time0)
	// Windows [0,15), [10,25), [20,35) …: from minute 10 on two overlap; the newest must go.
	if got := f.at(slot0 - 1); len(got) != 0 {
		t.Fatalf("released %v before the first slot", got)
	}
	if f.next() != slot0 {
		t.Fatalf("next = %d, want the first slot", f.next()-slot0)
	}
	for {
		at, ok := f.s.next()
		if !ok {
			break
		}
		f.at(at)
		f.answerAll(true, at)
		// Nothing more is due at the same instant, and no slot is skipped.
		if got := f.at(at); len(got) != 0 {
			t.Fatalf("released %v again at %d", got, at-slot0)
		}
	}
	want := make([]int64, 23)
	for i := range want {
		want[i] = int64(i + 1)
	}
	if !slices.Equal(f.history, want) {
		t.Fatalf("released %v, want each renewal once, in order", f.history)
	}
	if f.s.runs() != 0 || f.s.renewals != 0 || !slices.Equal(f.drops, []string{dropExpired}) {
		t.Fatalf("after the last window: runs %d renewals %d drops %v", f.s.runs(), f.s.renewals, f.drops)
	}
}

func TestSlotOpensAtNotBeforeExactly(t *testing.T) {
	f := newSchedFixture(t, "node-a")
	f.s.hold("node-a", gridRun("node-a", 3, slot0).held(t), slot0-time0)
	f.s.setAttached(false, slot0+minute)
	if got := f.at(slot0 + minute); !slices.Equal(got, []int64{1}) {
		t.Fatalf("on detach inside the first window: %v", got)
	}
	f.answerAll(true, slot0+minute)
	if f.next() != slot0+10*minute {
		t.Fatalf("next = %d, want the second slot", f.next()-slot0)
	}
	if got := f.at(slot0 + 10*minute - 1); len(got) != 0 {
		t.Fatalf("released %v 1 ms before its slot", got)
	}
	if got := f.at(slot0 + 10*minute); !slices.Equal(got, []int64{2}) {
		t.Fatalf("at the second slot: %v", got)
	}
}

func TestFutureRunReleasesNothingEarly(t *testing.T) {
	f := newSchedFixture(t, "node-a")
	start := slot0 + 60*minute
	f.s.hold("node-a", gridRun("node-a", 5, start).held(t), slot0)
	f.s.setAttached(false, slot0)
	for _, now := range []int64{slot0, slot0 + 30*minute, start - 1} {
		if got := f.at(now); len(got) != 0 {
			t.Fatalf("released %v at %d, before the run's first slot %d", got, now-slot0, start-slot0)
		}
	}
	if f.next() != start {
		t.Fatalf("next = %d, want the first slot %d", f.next()-slot0, start-slot0)
	}
	if got := f.at(start); !slices.Equal(got, []int64{1}) {
		t.Fatalf("at the first slot: %v", got)
	}
}

func TestReattachStopsReleaseMidRun(t *testing.T) {
	f := newSchedFixture(t, "node-a")
	f.s.hold("node-a", gridRun("node-a", 10, slot0).held(t), slot0-time0)
	f.s.setAttached(false, slot0)
	f.at(slot0)
	f.answerAll(true, slot0)
	f.at(slot0 + 10*minute)
	f.answerAll(true, slot0+10*minute)
	f.s.setAttached(true, slot0+12*minute)
	for _, now := range []int64{slot0 + 20*minute, slot0 + 30*minute, slot0 + 45*minute} {
		if got := f.at(now); len(got) != 0 {
			t.Fatalf("released %v at %d while attached", got, now-slot0)
		}
	}
	// Attached, the run waits only for its end.
	if f.next() != slot0+9*10*minute+15*minute {
		t.Fatalf("next while attached = %d, want the run's last expiry", f.next()-slot0)
	}
	// Detached again at minute 47: the newest current window (slot 40) goes at once.
	f.s.setAttached(false, slot0+47*minute)
	if got := f.at(slot0 + 47*minute); !slices.Equal(got, []int64{5}) {
		t.Fatalf("on the next detach: %v", got)
	}
	// A push in flight when the relay attaches still has its answer recorded, and nothing follows.
	f.s.setAttached(true, slot0+48*minute)
	f.answerAll(true, slot0+48*minute)
	if got := f.at(slot0 + 50*minute); len(got) != 0 {
		t.Fatalf("released %v after re-attach", got)
	}
}

// TestNodeReconnectRepushesOnlyWhatItDidNotAcknowledge: a new connection or session starts release
// afresh, but a renewal the node acknowledged is never pushed to it again, whichever connection
// it acknowledged it on.
func TestNodeReconnectRepushesOnlyWhatItDidNotAcknowledge(t *testing.T) {
	f := newSchedFixture(t, "node-a")
	f.s.hold("node-a", gridRun("node-a", 10, slot0).held(t), slot0-time0)
	f.s.setAttached(false, slot0)
	f.at(slot0)
	f.answerAll(true, slot0)
	if got := f.at(slot0 + 5*minute); len(got) != 0 {
		t.Fatalf("re-pushed %v the node acknowledged", got)
	}
	// The connection ends: nothing is pushed, the run stays.
	f.s.gone("node-a", f.node.ID(), slot0+5*minute)
	if got := f.at(slot0 + 10*minute); len(got) != 0 || f.s.runs() != 1 {
		t.Fatalf("with no connection: released %v, runs %d", got, f.s.runs())
	}
	// The node comes back on a new connection with a new session: the current one goes again.
	back := newFakeNode("node-a", cloudlyA, "rt-cluster-a", 2)
	f.bind(back, slot0+12*minute)
	rs := f.s.releases(slot0+12*minute, 0)
	if len(rs) != 1 || rs[0].node != back || rs[0].run.renewals[rs[0].idx].sequence != 2 || string(rs[0].session) != string(back.Session().Raw) {
		t.Fatalf("after reconnect: %+v", rs)
	}
	f.s.result(rs[0], true, slot0+12*minute)
	// The same binding reported again is not a new session.
	if f.bind(back, slot0+13*minute); len(f.at(slot0+13*minute)) != 0 {
		t.Fatal("the same binding again re-pushed")
	}
	// A rotation on the same connection is a new session, but the node acknowledged the current
	// renewal: it is not pushed again; the next one goes on the new session when its slot opens.
	rotated := &fakeNode{id: back.id, session: back.session}
	rotated.session.Raw = []byte(`{"rotated":true}`)
	f.bind(rotated, slot0+14*minute)
	if got := f.at(slot0 + 14*minute); len(got) != 0 {
		t.Fatalf("after rotation, re-pushed %v the node acknowledged", got)
	}
	rs = f.s.releases(slot0+20*minute, 0)
	if len(rs) != 1 || rs[0].run.renewals[rs[0].idx].sequence != 3 || string(rs[0].session) != `{"rotated":true}` {
		t.Fatalf("the next slot after rotation: %+v", rs)
	}
	// Unacknowledged, it goes again on the next session.
	f.s.result(rs[0], false, slot0+20*minute)
	again := &fakeNode{id: back.id, session: back.session}
	again.session.Raw = []byte(`{"rotated":2}`)
	f.bind(again, slot0+21*minute)
	if got := f.at(slot0 + 21*minute); !slices.Equal(got, []int64{3}) {
		t.Fatalf("after another rotation, the unacknowledged renewal: %v", got)
	}
}

func TestLateAnswerFromAnEndedSessionIsIgnored(t *testing.T) {
	f := newSchedFixture(t, "node-a")
	f.s.hold("node-a", gridRun("node-a", 10, slot0).held(t), slot0-time0)
	f.s.setAttached(false, slot0)
	f.at(slot0)
	old := f.pushed
	f.pushed = nil
	back := newFakeNode("node-a", cloudlyA, "rt-cluster-a", 2)
	f.bind(back, slot0+time0/60)
	if got := f.at(slot0 + time0/60); !slices.Equal(got, []int64{1}) {
		t.Fatalf("new session did not get the current renewal: %v", got)
	}
	// The old connection's answer arrives late: it neither acknowledges nor unblocks anything.
	f.s.result(old[0], true, slot0+2*minute)
	if ns := f.s.nodes["node-a"]; ns.acked != -1 || !ns.inflight {
		t.Fatalf("late answer changed the new session: acked %d inflight %v", ns.acked, ns.inflight)
	}
}

func TestRefusedPushIsRetriedWithBackoffWithinItsWindow(t *testing.T) {
	f := newSchedFixture(t, "node-a")
	f.s.hold("node-a", gridRun("node-a", 3, slot0).held(t), slot0-time0)
	f.s.setAttached(false, slot0)
	now := slot0
	var gaps []int64
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		if got := f.at(now); !slices.Equal(got, []int64{1}) {
			t.Fatalf("attempt %d at %d: %v", attempt, now-slot0, got)
		}
		f.answerAll(false, now)
		next := f.next()
		if got := f.at(next - 1); len(got) != 0 {
			t.Fatalf("retried %v before the backoff ended", got)
		}
		gaps = append(gaps, next-now)
		now = next
	}
	// 1 s, 2 s, … then the cap; after the last attempt the next event is the second slot.
	want := []int64{1000, 2000, 4000, 8000, 16000, 32000, 60000}
	if !slices.Equal(gaps[:7], want) || now != slot0+10*minute {
		t.Fatalf("retry gaps %v then %d; want %v then the second slot", gaps, now-slot0, want)
	}
	// The next slot goes whatever happened to the one before.
	if got := f.at(now); !slices.Equal(got, []int64{2}) {
		t.Fatalf("at the next slot: %v", got)
	}
}

func TestNextSlotGoesEvenWhileRetrying(t *testing.T) {
	f := newSchedFixture(t, "node-a")
	f.s.hold("node-a", gridRun("node-a", 3, slot0).held(t), slot0-time0)
	f.s.setAttached(false, slot0+10*minute-1500)
	f.at(slot0 + 10*minute - 1500)
	f.answerAll(false, slot0+10*minute-1500) // retry due at -500 ms
	f.at(f.next())
	f.answerAll(false, slot0+10*minute-500) // retry due at +1500 ms, after the next slot opens
	if f.next() != slot0+10*minute {
		t.Fatalf("next = %d, want the next slot before the retry", f.next()-slot0)
	}
	if got := f.at(slot0 + 10*minute); !slices.Equal(got, []int64{2}) {
		t.Fatalf("at the next slot: %v", got)
	}
}

func TestHoldWithANewProjectionForgetsAcknowledgements(t *testing.T) {
	f := newSchedFixture(t, "node-a")
	f.s.hold("node-a", gridRun("node-a", 3, slot0).held(t), slot0-time0)
	f.s.setAttached(false, slot0)
	f.at(slot0)
	f.answerAll(true, slot0)
	// The same projection re-signed: sequence 1 was acknowledged, so nothing goes.
	f.s.hold("node-a", gridRun("node-a", 3, slot0).held(t), slot0+minute)
	if got := f.at(slot0 + minute); len(got) != 0 {
		t.Fatalf("re-pushed %v under the same projection", got)
	}
	// A successor projection counts its own sequences: its sequence 1 goes.
	next := gridRun("node-a", 3, slot0).held(t)
	next.projection.Generation++
	f.s.hold("node-a", next, slot0+2*minute)
	if got := f.at(slot0 + 2*minute); !slices.Equal(got, []int64{1}) {
		t.Fatalf("successor projection: %v", got)
	}
}

func TestRunsDroppedOnCustodyForeignRebindAndClear(t *testing.T) {
	f := newSchedFixture(t, "node-a")
	f.s.hold("node-a", gridRun("node-a", 3, slot0).held(t), slot0-time0)
	other := newFakeNode("node-b", cloudlyA, "rt-cluster-a", 1)
	f.bind(other, slot0-time0)
	f.s.hold("node-b", gridRun("node-b", 3, slot0).held(t), slot0-time0)
	f.s.gone("node-b", other.ID(), slot0-time0)
	if f.s.runs() != 2 || f.s.renewals != 6 {
		t.Fatalf("runs %d renewals %d", f.s.runs(), f.s.renewals)
	}
	f.s.endCustody()
	if f.s.runs() != 0 || f.s.renewals != 0 || len(f.s.nodes) != 1 {
		t.Fatalf("after custody: runs %d renewals %d nodes %d (the carried node stays)", f.s.runs(), f.s.renewals, len(f.s.nodes))
	}
	f.s.setAttached(false, slot0)
	if got := f.at(slot0); len(got) != 0 {
		t.Fatalf("released %v after custody ended", got)
	}
	// A run whose node re-registers under another scope is dropped.
	f.s.hold("node-a", gridRun("node-a", 3, slot0).held(t), slot0)
	foreign := newFakeNode("node-a", cloudlyB, "rt-cluster-a", 9)
	s := foreign.Session()
	if !f.s.bound("node-a", foreign, foreign.ID(), s.Raw, []byte(`{"id":"cloudly-b","kind":"cloudly"}`), s.RuntimeNamespace, slot0) || f.s.runs() != 0 {
		t.Fatal("run kept for a session of another controller")
	}
	f.s.hold("node-a", gridRun("node-a", 3, slot0).held(t), slot0)
	f.s.clear("node-a")
	if f.s.runs() != 0 || !slices.Equal(f.drops, []string{dropCustody, dropCustody, dropForeign, dropCleared}) {
		t.Fatalf("drops %v", f.drops)
	}
}

func TestOneHeapManyNodes(t *testing.T) {
	s := newScheduler(nil)
	const n = 1000
	for i := range n {
		node := newFakeNode("node-"+string(rune('a'+i%26))+itoa(i), cloudlyA, "rt-cluster-a", 1)
		ss := node.Session()
		s.bound(ss.NodeID, node, node.ID(), ss.Raw, []byte(`{"id":"cloudly-a","kind":"cloudly"}`), ss.RuntimeNamespace, slot0)
		// Runs staggered by one second so that each node's slot opens at its own time.
		s.hold(ss.NodeID, gridRun(ss.NodeID, 2, slot0+int64(i)*1000).held(t), slot0)
	}
	s.setAttached(false, slot0)
	released := 0
	for {
		at, ok := s.next()
		if !ok || at > slot0+n*1000 {
			break
		}
		rs := s.releases(at, 0)
		for _, r := range rs {
			if r.run.renewals[r.idx].notBefore != at {
				t.Fatalf("released at %d a renewal due at %d", at, r.run.renewals[r.idx].notBefore)
			}
			s.result(r, true, at)
			if r.run.renewals[r.idx].sequence == 1 {
				released++
			}
		}
	}
	if released != n {
		t.Fatalf("released %d first renewals, want one for each of %d nodes", released, n)
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}
