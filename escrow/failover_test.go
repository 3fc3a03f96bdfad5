package escrow

import (
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// What the escrow does so that a failover loses nothing: a hold answered only once the standbys
// have it, acknowledgements and re-binding pairs that go with the copy, and a pair that lives as
// long as the node's run.

// attachedUpstream is the relay's Cloudly session, attached.
type attachedUpstream struct{}

func (attachedUpstream) Attached() bool                              { return true }
func (attachedUpstream) Call(string, json.RawMessage, feature.Reply) {}

// standbys is the HA leader's Sync as the escrow sees it: each call waits until the test answers.
type standbys struct {
	mu      sync.Mutex
	waiting []func(bool)
}

func (s *standbys) Sync(done func(bool)) {
	s.mu.Lock()
	s.waiting = append(s.waiting, done)
	s.mu.Unlock()
}

func (s *standbys) answer(replicated bool) int {
	s.mu.Lock()
	w := s.waiting
	s.waiting = nil
	s.mu.Unlock()
	for _, done := range w {
		done(replicated)
	}
	return len(w)
}

type replies struct {
	mu  sync.Mutex
	got []string
}

func (r *replies) reply(body json.RawMessage, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.got = append(r.got, contracts.RefusalLabel(err))
		return
	}
	r.got = append(r.got, string(body))
}

func (r *replies) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// TestHoldAnsweredOnceTheStandbysHaveIt: with HA the leader answers { held } only once Sync says
// every standby acknowledged the run — whether or not they all did in time — and a refusal, which
// changes nothing, at once.
func TestHoldAnsweredOnceTheStandbysHaveIt(t *testing.T) {
	e, _, _ := holdFixture(t)
	e.UseUpstream(attachedUpstream{})
	sb := &standbys{}
	e.UseReplicaSync(sb)
	var r replies
	e.ServeCloudly(contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, gridRun("node-a", 6, slot0).body(t), r.reply)
	if got := r.all(); len(got) != 0 {
		t.Fatalf("answered %v before the standbys acknowledged the run", got)
	}
	if e.sched.runs() != 1 {
		t.Fatal("the run is not held while the answer waits")
	}
	if n := sb.answer(true); n != 1 {
		t.Fatalf("%d Sync calls for one hold", n)
	}
	if got := r.all(); !slices.Equal(got, []string{`{"held":6}`}) {
		t.Fatalf("after the standbys acknowledged: %v", got)
	}

	// No standby (or one that missed the bound): Sync says so at once, and the hold is answered.
	runB := gridRun("node-b", 3, slot0)
	runB.controller = cloudlyB
	e.ServeCloudly(contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, runB.body(t), r.reply)
	sb.answer(false)
	// A refusal is answered at once: nothing was held, nothing to wait for.
	e.ServeCloudly(contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, gridRun("node-gone", 3, slot0).body(t), r.reply)
	if got := r.all(); !slices.Equal(got, []string{`{"held":6}`, `{"held":3}`, string(contracts.EscrowNodeNotCarried)}) {
		t.Fatalf("answers: %v", got)
	}
	if n := sb.answer(true); n != 0 {
		t.Fatalf("a refusal waited for the standbys (%d Sync calls)", n)
	}
}

// TestNodeRegisteredLongBeforeAnOutageRebindsAndGetsItsRenewal: a node registered six hours
// before Cloudly goes away, whose escrow Cloudly renewed every hour since, re-binds byte for byte
// once its socket drops in the outage, on the leader and on a standby that copied the escrow, and
// gets its current renewal.
func TestNodeRegisteredLongBeforeAnOutageRebindsAndGetsItsRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := startBubble(t)
		defer b.stop()
		standby, err := New(Options{})
		if err != nil {
			t.Fatal(err)
		}
		stop := b.e.Replicate(func(key string, value []byte) {
			if err := standby.Adopt(key, value); err != nil {
				t.Errorf("adopt %s: %v", key, err)
			}
		})
		defer stop()

		b.e.Attached(nil)
		node := newFakeNode("node-a", cloudlyA, "rt-cluster-a", 1)
		b.e.NodeBound(node)
		registration := json.RawMessage(`{"nodeId":"node-a","nodeInstanceNonce":"n-1"}`)
		answer := json.RawMessage(`{"session":{"nodeId":"node-a"},"protocol":{}}`)
		b.e.Accepted("node-a", b.e.RegistrationDigest(registration), answer)
		start := nowMs()
		for hour := range 6 {
			// Cloudly's hourly run: 23 renewals, 3 h 55 min ahead.
			if _, err := b.e.Hold(true, gridRun("node-a", 23, start+int64(hour)*60*minute).body(t)); err != nil {
				t.Fatal(err)
			}
			sleepUntil(start + int64(hour+1)*60*minute - 5*minute)
		}
		// 5 h 55 min after its registration the node's socket drops, and Cloudly goes away.
		node.end()
		synctest.Wait() // the escrow has seen the connection end
		b.e.Detached()
		synctest.Wait()
		for name, e := range map[string]*Escrow{"leader": b.e, "standby": standby} {
			got, ok := e.Rebind(e.RegistrationDigest(registration))
			if !ok || string(got) != string(answer) {
				t.Fatalf("the %s does not re-bind a node registered %d min before (%s, %v)", name, (nowMs()-start)/minute, got, ok)
			}
		}
		back := newFakeNode("node-a", cloudlyA, "rt-cluster-a", 2)
		b.e.NodeBound(back)
		synctest.Wait()
		// The last run started at 5 h; at 5 h 55 min its sixth renewal (5 h 50 min) is current.
		if got := back.sequences(); !slices.Equal(got, []int64{6}) {
			t.Fatalf("the re-bound node got %v, want its current renewal", got)
		}
		// The run ends at 5 h + 3 h 55 min: the pair goes with it.
		sleepUntil(start + 5*60*minute + 235*minute + minute)
		if _, ok := b.e.Rebind(b.e.RegistrationDigest(registration)); ok {
			t.Fatal("the pair outlived the node's run")
		}
		if _, ok := standby.Rebind(standby.RegistrationDigest(registration)); ok {
			t.Fatal("the standby's pair outlived the leader's")
		}
	})
}

// TestReplicaCarriesAcknowledgements: a standby that leads after a failover pushes no renewal the
// node acknowledged to the old leader, and pushes again what it did not.
func TestReplicaCarriesAcknowledgements(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		leader, standby := startBubble(t), startBubble(t)
		defer leader.stop()
		defer standby.stop()
		standby.e.Leading(false)
		stop := leader.e.Replicate(func(key string, value []byte) {
			if err := standby.e.Adopt(key, value); err != nil {
				t.Errorf("adopt %s: %v", key, err)
			}
		})
		defer stop()
		leader.e.Attached(nil)
		acks := newFakeNode("node-a", cloudlyA, "rt-cluster-a", 1)
		silent := newFakeNode("node-b", cloudlyA, "rt-cluster-a", 1)
		silent.hold = true // never answers: acknowledges nothing
		leader.e.NodeBound(acks)
		leader.e.NodeBound(silent)
		start := nowMs()
		for _, n := range []string{"node-a", "node-b"} {
			if _, err := leader.e.Hold(true, gridRun(n, 10, start).body(t)); err != nil {
				t.Fatal(err)
			}
		}
		leader.e.Detached()
		synctest.Wait()
		if !slices.Equal(acks.sequences(), []int64{1}) || !slices.Equal(silent.sequences(), []int64{1}) {
			t.Fatalf("the leader pushed %v and %v", acks.sequences(), silent.sequences())
		}
		// The leader goes; the nodes come back to the standby, which leads while Cloudly is away.
		leader.e.Leading(false)
		acks.end()
		silent.end()
		sleepUntil(start + 3*minute)
		standby.e.Leading(true)
		standby.e.Detached()
		a2, b2 := newFakeNode("node-a", cloudlyA, "rt-cluster-a", 2), newFakeNode("node-b", cloudlyA, "rt-cluster-a", 2)
		standby.e.NodeBound(a2)
		standby.e.NodeBound(b2)
		synctest.Wait()
		if got := a2.sequences(); len(got) != 0 {
			t.Fatalf("the new leader pushed %v, which the node acknowledged to the old one", got)
		}
		if got := b2.sequences(); !slices.Equal(got, []int64{1}) {
			t.Fatalf("the new leader pushed %v to the node that acknowledged nothing, want its current renewal", got)
		}
		sleepUntil(start + 10*minute)
		if got := a2.sequences(); !slices.Equal(got, []int64{2}) {
			t.Fatalf("the next slot on the new leader: %v", got)
		}
	})
}
