package ha

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

const testDeadline = 4 * time.Second

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// The tenure ends a renew deadline after the successful renewal was sent, however late its answer
// came; an older renewal answered later never shortens it; outside a term it is never held.
func TestTenureRunsFromTheSend(t *testing.T) {
	clk := newFakeClock()
	tn := newTenure(clk.Now, testDeadline)
	sent := tn.sending()
	clk.advance(time.Second) // the answer takes a second
	tn.renewed(sent)
	if tn.held() {
		t.Fatal("held before a term began")
	}
	tn.begin()
	if !tn.held() || tn.left() != testDeadline-time.Second {
		t.Fatalf("held %v, %s left; want held, %s left", tn.held(), tn.left(), testDeadline-time.Second)
	}
	older := tn.sending()
	clk.advance(500 * time.Millisecond)
	newer := tn.sending()
	tn.renewed(newer)
	tn.renewed(older) // answered after the newer one
	if want := testDeadline; tn.left() != want {
		t.Fatalf("%s left after a renewal sent just now, want %s", tn.left(), want)
	}
	clk.advance(testDeadline - time.Nanosecond)
	if !tn.held() {
		t.Fatal("not held a nanosecond before the renew deadline after the send")
	}
	clk.advance(time.Nanosecond)
	if tn.held() {
		t.Fatal("held at the renew deadline after the last renewal's send")
	}
	tn.renewed(tn.sending())
	tn.end()
	if tn.held() {
		t.Fatal("held after the term ended")
	}
}

// slowLock is a Lease lock whose writes are answered after a delay on the fake clock, as a
// brownout answers them: the write reaches the API server, which applies it, and the answer comes
// late. It records what it was asked to write.
type slowLock struct {
	clk    *fakeClock
	delay  time.Duration
	holder string // the record Get answers with
	writes []resourcelock.LeaderElectionRecord
}

func (l *slowLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	return &resourcelock.LeaderElectionRecord{HolderIdentity: l.holder}, []byte(l.holder), nil
}

func (l *slowLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.Update(ctx, ler)
}

func (l *slowLock) Update(_ context.Context, ler resourcelock.LeaderElectionRecord) error {
	l.clk.advance(l.delay)
	l.writes = append(l.writes, ler)
	l.holder = ler.HolderIdentity
	return nil
}

func (l *slowLock) RecordEvent(string) {}
func (l *slowLock) Identity() string   { return "relay-a" }
func (l *slowLock) Describe() string   { return "relay-ha/relay" }
func (l *slowLock) Key() string        { return "relay-a" }

func observed(clk *fakeClock, inner resourcelock.Interface) (*Elector, *observedLock) {
	e := &Elector{cfg: Config{Identity: "relay-a", RenewDeadline: testDeadline}, tenure: newTenure(clk.Now, testDeadline)}
	e.tenure.begin()
	return e, &observedLock{Interface: inner, e: e}
}

// A renewal whose answer arrives later than the renew deadline after it was sent buys no tenure:
// the tenure ended at send + renew deadline, before the answer, although the API server applied
// it. One answered in time holds until send + renew deadline.
func TestTenureOfALateRenewalEndsAtItsSend(t *testing.T) {
	clk := newFakeClock()
	inner := &slowLock{clk: clk, delay: 1500 * time.Millisecond, holder: "relay-a"}
	e, l := observed(clk, inner)
	if err := l.Update(context.Background(), resourcelock.LeaderElectionRecord{HolderIdentity: "relay-a"}); err != nil {
		t.Fatal(err)
	}
	if !e.Held() || e.tenure.left() != testDeadline-1500*time.Millisecond {
		t.Fatalf("held %v, %s left after a renewal answered in 1.5 s; want %s", e.Held(), e.tenure.left(), testDeadline-1500*time.Millisecond)
	}
	inner.delay = testDeadline + time.Second
	if err := l.Update(context.Background(), resourcelock.LeaderElectionRecord{HolderIdentity: "relay-a"}); err != nil {
		t.Fatal(err)
	}
	if e.Held() {
		t.Fatalf("held after a renewal answered %s after it was sent (renew deadline %s)", inner.delay, testDeadline)
	}
}

// A write naming another holder buys this relay nothing; client-go's release of a Lease that
// another relay holds now — what a resumed relay's client-go attempts on the record it remembers —
// is refused without a write.
func TestObservedLockReleasesOnlyItsOwnLease(t *testing.T) {
	clk := newFakeClock()
	inner := &slowLock{clk: clk, holder: "relay-b"}
	e, l := observed(clk, inner)
	if err := l.Update(context.Background(), resourcelock.LeaderElectionRecord{HolderIdentity: "relay-b"}); err != nil {
		t.Fatal(err)
	}
	if e.Held() {
		t.Fatal("a write naming relay-b gave relay-a a tenure")
	}
	if _, _, err := l.Get(context.Background()); err != nil {
		t.Fatal(err)
	}
	inner.writes = nil
	if err := l.Update(context.Background(), resourcelock.LeaderElectionRecord{}); !errors.Is(err, errNotOurs) || len(inner.writes) != 0 {
		t.Fatalf("release of relay-b's Lease: %v, %d writes; want errNotOurs and none", err, len(inner.writes))
	}
	if got := l.previousHolder(); got != "relay-b" {
		t.Fatalf("previous holder %q, want relay-b", got)
	}
	inner.holder = "relay-a"
	if _, _, err := l.Get(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := l.Update(context.Background(), resourcelock.LeaderElectionRecord{}); err != nil || len(inner.writes) != 1 {
		t.Fatalf("release of relay-a's own Lease: %v, %d writes; want one", err, len(inner.writes))
	}
	if got := l.previousHolder(); got != "relay-b" {
		t.Fatalf("previous holder %q after relay-a's own record, want relay-b still", got)
	}
}

// The watch fences exactly when the tenure runs out: renewals sent every half second keep it, and
// the first one missing ends it a renew deadline after the last one's send.
func TestTenureWatchFencesWhenItRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tn := newTenure(time.Now, testDeadline)
		tn.begin()
		tn.renewed(tn.sending())
		fenced := make(chan time.Time, 1)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go tn.watch(ctx, func() { fenced <- time.Now() })
		var last time.Time
		for range 10 {
			advance(500 * time.Millisecond)
			last = time.Now()
			sent := tn.sending()
			advance(100 * time.Millisecond) // answered a little later
			tn.renewed(sent)
			select {
			case <-fenced:
				t.Fatal("fenced while renewals kept the tenure")
			default:
			}
		}
		at := <-fenced
		if got := at.Sub(last); got != testDeadline {
			t.Fatalf("fenced %s after the last renewal's send, want the renew deadline %s", got, testDeadline)
		}
		if tn.held() {
			t.Fatal("held once fenced")
		}
	})
}

// advance moves the bubble's fake clock on by d and waits until every goroutine in it is blocked,
// so that a fence due by then has happened: the one place these tests let time pass, and time
// passing is what they test.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}
