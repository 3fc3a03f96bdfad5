package platform

import (
	"context"
	"encoding/json"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// fakeUpstream is a Cloudly session that answers the desired state at once and refuses
// everything else; it offers no streams (so no closure is carried).
type fakeUpstream struct {
	mu    sync.Mutex
	calls map[string]int
}

func (u *fakeUpstream) Attached() bool { return true }

func (u *fakeUpstream) Call(method string, _ json.RawMessage, done feature.Reply) {
	u.mu.Lock()
	u.calls[method]++
	u.mu.Unlock()
	if method == contracts.MethodGetClusterPlatformDesiredState {
		done(json.RawMessage(`{"capabilities":{},"providerConfigs":{},"bindings":[{"nodeId":"node-a","binding":1},{"nodeId":"node-b","binding":2}]}`), nil)
		return
	}
	done(nil, contracts.RelayMethodUnknown.Refuse("%s", method))
}

func (u *fakeUpstream) count(m string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[m]
}

// fakeCorestore records when each node's Corestore was called; failing nodes refuse the desired
// state as unreachable.
type fakeCorestore struct {
	mu      sync.Mutex
	puts    map[string][]time.Time // origin → hand-over attempts
	lists   map[string][]time.Time // origin → backup listings
	failing map[string]bool
}

func (c *fakeCorestore) PutDesiredState(_ context.Context, origin string, _ contracts.Secret, _ []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.puts[origin] = append(c.puts[origin], time.Now())
	if c.failing[origin] {
		return contracts.RestoreNodeUnreachable.Refuse("cannot connect")
	}
	return nil
}

func (c *fakeCorestore) ReadyBackups(_ context.Context, origin string, _ contracts.Secret) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lists[origin] = append(c.lists[origin], time.Now())
	return []byte(`{"backups":[]}`), nil
}

func (c *fakeCorestore) WantedRestores(context.Context, string, contracts.Secret) ([]byte, error) {
	return []byte(`{"restores":[]}`), nil
}

func (c *fakeCorestore) MarkDelivered(context.Context, string, contracts.Secret, string) error {
	return nil
}

func (c *fakeCorestore) OpenBackupClosure(context.Context, string, contracts.Secret, string) (io.ReadCloser, error) {
	return nil, contracts.RestoreNodeRefused.Refuse("none")
}

func (c *fakeCorestore) PutRestoreClosure(context.Context, string, contracts.Secret, string, []byte, io.Reader) error {
	return contracts.RestoreNodeRefused.Refuse("none")
}

func (c *fakeCorestore) times(m map[string][]time.Time, origin string) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), m[origin]...)
}

// TestCadence, on a fake clock with no I/O: the desired state is pulled at attach and every 60 s;
// listings run at once when the credential is there and every 30 s after; a Corestore that
// cannot take its desired state is retried with a doubling backoff capped at 30 s, while the other
// node's Corestore got its state at once and is never retried.
func TestCadence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := &fakeUpstream{calls: map[string]int{}}
		cs := &fakeCorestore{puts: map[string][]time.Time{}, lists: map[string][]time.Time{}, failing: map[string]bool{"https://b.example": true}}
		p, err := New(cs, Options{})
		if err != nil {
			t.Fatal(err)
		}
		p.UseUpstream(up)
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		defer func() { stop(); <-done }() // a failing check still ends every goroutine of the bubble
		p.Configured(contracts.ClusterRelayConfig{Corestores: []contracts.CorestoreOrigin{{NodeID: "node-a", Origin: "https://a.example"}, {NodeID: "node-b", Origin: "https://b.example"}}})
		p.mu.Lock()
		for _, n := range p.nodes {
			n.mu.Lock()
			n.sched.jitter = func(n int64) int64 { return n - 1 } // the ceiling: the backoff's bound
			n.mu.Unlock()
		}
		a, b := p.nodes["node-a"], p.nodes["node-b"]
		p.mu.Unlock()
		a.setCredential(contracts.NewSecret("cred-a"))
		b.setCredential(contracts.NewSecret("cred-b"))
		start := time.Now()
		p.Attached(up)
		synctest.Wait()

		if n := up.count(contracts.MethodGetClusterPlatformDesiredState); n != 1 {
			t.Fatalf("pulls at attach: %d", n)
		}
		if l := cs.times(cs.lists, "https://a.example"); len(l) != 1 || !l[0].Equal(start) {
			t.Fatalf("listing at attach: %v", l)
		}
		advance(30*time.Second - time.Nanosecond)
		if l := cs.times(cs.lists, "https://a.example"); len(l) != 1 {
			t.Fatalf("a listing before 30 s: %v", l)
		}
		advance(time.Nanosecond)
		if l := cs.times(cs.lists, "https://a.example"); len(l) != 2 || l[1].Sub(start) != 30*time.Second {
			t.Fatalf("the second listing: %v", l)
		}
		advance(30*time.Second - time.Nanosecond)
		if n := up.count(contracts.MethodGetClusterPlatformDesiredState); n != 1 {
			t.Fatalf("pulls before 60 s: %d", n)
		}
		advance(time.Nanosecond)
		if n := up.count(contracts.MethodGetClusterPlatformDesiredState); n != 2 {
			t.Fatalf("pulls at 60 s: %d", n)
		}

		// node-a took its state at attach and again after the 60 s pull; node-b was retried
		// 0.25 s, 0.5 s, 1 s, 2 s, … 16 s apart, then at once for the newer state at 60 s.
		if pa := cs.times(cs.puts, "https://a.example"); len(pa) != 2 || !pa[0].Equal(start) {
			t.Fatalf("node-a's hand-overs: %v", pa)
		}
		pb := cs.times(cs.puts, "https://b.example")
		want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second,
			8 * time.Second, 16 * time.Second, 60*time.Second - 31750*time.Millisecond}
		if len(pb) < len(want)+1 || !pb[0].Equal(start) {
			t.Fatalf("node-b's hand-overs: %v", pb)
		}
		for i, w := range want {
			if got := pb[i+1].Sub(pb[i]); got != w {
				t.Fatalf("node-b's retry %d after %s, want %s (all: %v)", i+1, got, w, pb)
			}
		}
		if st := p.Status().(Status); st.Nodes[0].Handed != st.Nodes[0].Desired || st.Nodes[1].Handed != 0 ||
			st.Nodes[1].HandOver != string(contracts.RestoreNodeUnreachable) {
			t.Fatalf("status %+v", st.Nodes)
		}

		// Detached: no more listings or pulls; the credentials go after the horizon.
		p.Detached()
		lists := len(cs.times(cs.lists, "https://a.example"))
		advance(DefaultCredentialHorizon - time.Second)
		if got := len(cs.times(cs.lists, "https://a.example")); got != lists || up.count(contracts.MethodGetClusterPlatformDesiredState) != 2 {
			t.Fatalf("listed %d times or pulled while detached", got-lists)
		}
		if !p.Status().(Status).Nodes[0].Credential {
			t.Fatal("the credential went before the horizon")
		}
		advance(time.Second)
		if p.Status().(Status).Nodes[0].Credential {
			t.Fatal("the credential outlived the horizon")
		}
	})
}

// TestScheduleBackoff: a failed hand-over waits under a ceiling that doubles from 250 ms to 30 s
// (full jitter below it); news resets it; listings follow their cadence.
func TestScheduleBackoff(t *testing.T) {
	var ceilings []time.Duration
	s := schedule{jitter: func(n int64) int64 { ceilings = append(ceilings, time.Duration(n-1)); return 0 }}
	now := time.Unix(0, 0)
	for range 10 {
		if d := s.stateFailed(now); d != 0 {
			t.Fatalf("full jitter's floor is 0, got %s", d)
		}
	}
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second,
		8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second, 30 * time.Second}
	for i := range want {
		if ceilings[i] != want[i] {
			t.Fatalf("ceilings %v, want %v", ceilings, want)
		}
	}
	s.newState(now)
	s.stateFailed(now)
	if ceilings[len(ceilings)-1] != 250*time.Millisecond {
		t.Fatal("news did not reset the backoff")
	}
	s.stateHanded()
	if _, due := wait(s.stateDue, now); due {
		t.Fatal("a handed state is still due")
	}
	s.listFrom(now, 5*time.Second)
	s.listFrom(now, time.Second) // sooner wins
	if d, _ := wait(s.listDue, now); d != time.Second {
		t.Fatalf("list due in %s", d)
	}
	s.listed(now, 30*time.Second)
	if d, _ := wait(s.listDue, now); d != 30*time.Second {
		t.Fatalf("list due in %s after a listing", d)
	}
	s.stopListing()
	if _, due := wait(s.listDue, now); due {
		t.Fatal("listing due while detached")
	}
}

// blockingCorestore holds every desired state until the call's context ends.
type blockingCorestore struct {
	fakeCorestore
	entered chan struct{}
}

func (c *blockingCorestore) PutDesiredState(ctx context.Context, _ string, _ contracts.Secret, _ []byte) error {
	select {
	case c.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return contracts.RestoreNodeUnreachable.Refuse("abandoned")
}

// TestCloseDuringHandOver: closing the agent while a hand-over waits on its Corestore ends every
// goroutine at once — the hand-over cut short leaves its state due, and the loop must not spin on it.
func TestCloseDuringHandOver(t *testing.T) {
	cs := &blockingCorestore{fakeCorestore: fakeCorestore{puts: map[string][]time.Time{}, lists: map[string][]time.Time{}}, entered: make(chan struct{}, 1)}
	p, err := New(cs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	up := &fakeUpstream{calls: map[string]int{}}
	p.UseUpstream(up)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	p.Configured(contracts.ClusterRelayConfig{Corestores: []contracts.CorestoreOrigin{{NodeID: "node-a", Origin: "https://a.example"}}})
	p.mu.Lock()
	a := p.nodes["node-a"]
	p.mu.Unlock()
	a.setCredential(contracts.NewSecret("cred-a"))
	p.Attached(up)
	select {
	case <-cs.entered:
	case <-time.After(time.Minute): // a guard against a hang, not a time the agent must meet
		t.Fatal("no hand-over began")
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute): // a guard: Close returns at once unless a loop spins
		t.Fatal("Close did not return: a loop spins on its ended context")
	}
}

// TestStandbyWorksForNoOne, on a fake clock: a relay that stops leading (docs/ha.md) hands over no
// desired state, lists nothing and drops its credentials; leading again, it waits for a new
// credential before it works again.
func TestStandbyWorksForNoOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := &fakeUpstream{calls: map[string]int{}}
		cs := &fakeCorestore{puts: map[string][]time.Time{}, lists: map[string][]time.Time{}}
		p, err := New(cs, Options{})
		if err != nil {
			t.Fatal(err)
		}
		p.UseUpstream(up)
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		defer func() { stop(); <-done }()
		p.Configured(contracts.ClusterRelayConfig{Corestores: []contracts.CorestoreOrigin{{NodeID: "node-a", Origin: "https://a.example"}}})
		p.mu.Lock()
		a := p.nodes["node-a"]
		p.mu.Unlock()
		a.setCredential(contracts.NewSecret("cred-a"))
		p.Attached(up)
		synctest.Wait()
		puts, lists := len(cs.times(cs.puts, "https://a.example")), len(cs.times(cs.lists, "https://a.example"))
		if puts != 1 || lists != 1 {
			t.Fatalf("leading: %d hand-overs, %d listings", puts, lists)
		}
		p.Leading(false)
		advance(10 * time.Minute)
		if got, l := len(cs.times(cs.puts, "https://a.example")), len(cs.times(cs.lists, "https://a.example")); got != puts || l != lists {
			t.Fatalf("a standby handed over %d states and listed %d times", got-puts, l-lists)
		}
		if st := p.Status().(Status); st.Nodes[0].Credential {
			t.Fatal("a standby keeps the credential")
		}
		p.Leading(true)
		a.setCredential(contracts.NewSecret("cred-a2"))
		synctest.Wait()
		if l := len(cs.times(cs.lists, "https://a.example")); l != lists+1 {
			t.Fatalf("leading again with a credential: %d listings, want %d", l, lists+1)
		}
	})
}

// advance moves the bubble's fake clock on by d — a timer of the bubble's clock fires when every
// goroutine in it is blocked, no wall-clock time passes — and waits until every goroutine is
// blocked again: the one place these tests let time pass, and time passing is what they test.
func advance(d time.Duration) {
	<-time.After(d)
	synctest.Wait()
}

// TestClosureLimitIsTheCorestoreLimit: by default a closure may carry the Corestore closure limit,
// 256 MiB, and no option raises it.
func TestClosureLimitIsTheCorestoreLimit(t *testing.T) {
	for _, set := range []int64{0, -1, contracts.MaxCorestoreClosureBytes + 1} {
		o := Options{MaxClosureBytes: set}
		o.fill()
		if o.MaxClosureBytes != 256<<20 || contracts.MaxCorestoreClosureBytes != 256<<20 {
			t.Fatalf("MaxClosureBytes %d filled as %d", set, o.MaxClosureBytes)
		}
	}
	o := Options{MaxClosureBytes: 1 << 20}
	if o.fill(); o.MaxClosureBytes != 1<<20 {
		t.Fatalf("a lower limit filled as %d", o.MaxClosureBytes)
	}
}
