package budget

import (
	"sync"
	"testing"
	"testing/synctest"
)

func TestShareCaps(t *testing.T) {
	b := New(100)
	s := b.NewShare(30, nil, func() {})
	defer s.Close()
	if !s.Charge(50) {
		t.Fatal("the first charge of an empty share must fit its cap, whatever its size")
	}
	if s.Charge(1) {
		t.Fatal("a charge beyond the share's cap fitted")
	}
	s.Release(50)
	if !s.Charge(30) || s.Charge(1) {
		t.Fatal("the cap is not exact")
	}
	s.Release(30)
	if b.Used() != 0 || s.Used() != 0 || b.Underflows() != 0 {
		t.Fatalf("after releasing everything: pool %d, share %d, underflows %d", b.Used(), s.Used(), b.Underflows())
	}
}

func TestPoolRefusesAndEvictsTheHeaviestStalledShare(t *testing.T) {
	b := New(1 << 20) // its reserve's edge at 896 KiB
	var evicted []string
	share := func(name string, own int64, stalled bool) *Share {
		var s *Share
		s = b.NewShare(1<<30, func() (int64, bool) { return own, stalled }, func() {
			evicted = append(evicted, name)
			s.Release(int(s.Used())) // an evicted connection drops what is queued for it
		})
		return s
	}
	// Bytes waiting on a peer's own socket make it the victim, the most first; bytes behind Cloudly
	// (its share holds them, its socket does not) make no one a victim, nor does a peer that reads
	// what it is sent (little waits on its socket, 8 KiB here, under Small).
	light, heavy := share("light-stalled", 10<<10, true), share("heavy-stalled", 300<<10, true)
	reading, behindCloudly := share("heavy-reading", 8<<10, false), share("behind-cloudly", 0, true)
	light.Charge(10 << 10)
	heavy.Charge(300 << 10)
	reading.Charge(300 << 10)
	behindCloudly.Charge(200 << 10)
	if !reading.Charge(100<<10) || len(evicted) != 1 || evicted[0] != "heavy-stalled" {
		t.Fatalf("evicted %v: want the share with the most bytes waiting on its own stalled socket, and the charge taken", evicted)
	}
	if reading.Charge(300<<10) || len(evicted) != 2 || evicted[1] != "light-stalled" || b.Refusals() != 1 {
		t.Fatalf("evicted %v, refusals %d: want light evicted next and the charge, still too large, refused", evicted, b.Refusals())
	}
	if behindCloudly.Charge(300<<10) || len(evicted) != 2 {
		t.Fatalf("evicted %v: a share whose bytes wait behind Cloudly, or a reader, was evicted", evicted)
	}
	for _, s := range []*Share{light, heavy, reading, behindCloudly} {
		s.Release(int(s.Used()))
		s.Close()
	}
	if b.Used() != 0 || b.Underflows() != 0 || b.Evictions() != 2 {
		t.Fatalf("pool %d, underflows %d, evictions %d", b.Used(), b.Underflows(), b.Evictions())
	}
}

// TestEvictionNeedsNoStallPastSmall: while no peer has read nothing long enough to count as
// stalled, the one with the most bytes waiting on its own socket, past Small, goes first.
func TestEvictionNeedsNoStallPastSmall(t *testing.T) {
	b := New(1 << 20) // small 16 KiB
	var evicted []string
	share := func(name string, own int64) *Share {
		var s *Share
		s = b.NewShare(1<<30, func() (int64, bool) { return own, false }, func() {
			evicted = append(evicted, name)
			s.Release(int(s.Used()))
		})
		return s
	}
	piling, reading := share("piling-up", 600<<10), share("reading", 12<<10)
	piling.Charge(600 << 10)
	reading.Charge(280 << 10)
	if !reading.Charge(32<<10) || len(evicted) != 1 || evicted[0] != "piling-up" {
		t.Fatalf("evicted %v: want the share with more than Small waiting on its own socket", evicted)
	}
	if reading.Charge(700<<10) || len(evicted) != 1 {
		t.Fatalf("evicted %v: a share with less than Small on its own socket was evicted", evicted)
	}
}

// TestReserveKeepsRoomForSmallShares: shares whose bytes pile up stop at the reserve's edge; one
// that holds little is not refused because of them.
func TestReserveKeepsRoomForSmallShares(t *testing.T) {
	b := New(1 << 20) // reserve 128 KiB, small 16 KiB
	greedy := b.NewShare(1<<30, nil, nil)
	for greedy.Charge(16 << 10) {
	}
	if got, edge := b.Used(), b.Limit()-b.Reserve(); got > edge || got < edge-16<<10 {
		t.Fatalf("a growing share stopped at %d, want the reserve's edge %d", got, edge)
	}
	for i := range 8 {
		honest := b.NewShare(1<<30, nil, nil)
		if !honest.Charge(int(b.Small())) {
			t.Fatalf("small share %d refused with the pool at %d of %d", i, b.Used(), b.Limit())
		}
		if honest.Charge(1) {
			t.Fatal("a share past Small drew on the reserve")
		}
	}
}

// TestChargeWaitWaitsForRoom: a charge that does not fit waits for a release, and gives up, with
// nothing charged, when told to.
func TestChargeWaitWaitsForRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := New(1 << 20)
		s := b.NewShare(64<<10, nil, nil)
		s.Charge(64 << 10)
		got := make(chan bool)
		go func() { got <- s.ChargeWait(32<<10, nil, nil) }()
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("a charge past the share's cap did not wait")
		default:
		}
		if n := b.Waiters(); n != 1 {
			t.Fatalf("%d waiters while one charge waits", n)
		}
		s.Release(64 << 10)
		if !<-got || s.Used() != 32<<10 {
			t.Fatalf("after the release: share holds %d", s.Used())
		}
		if n := b.Waiters(); n != 0 {
			t.Fatalf("%d waiters once the charge was taken", n)
		}
		done := make(chan struct{})
		go func() { got <- s.ChargeWait(64<<10, nil, done) }()
		synctest.Wait()
		close(done)
		if <-got || s.Used() != 32<<10 {
			t.Fatalf("a cancelled wait charged something: share holds %d", s.Used())
		}
	})
}

func TestReleasingMoreThanChargedIsCaughtNotNegative(t *testing.T) {
	b := New(100)
	s := b.NewShare(50, nil, func() {})
	s.Charge(10)
	s.Release(11)
	if b.Underflows() == 0 {
		t.Fatal("an over-release was not counted")
	}
	if s.Used() < 0 || b.Used() < 0 {
		t.Fatalf("a count went below zero: share %d, pool %d", s.Used(), b.Used())
	}
}

func TestConcurrentChargesNeverExceedThePool(t *testing.T) {
	b := New(1 << 20)
	var wg sync.WaitGroup
	for range 8 {
		s := b.NewShare(1<<20, nil, func() {})
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.Close()
			for range 10_000 {
				if s.Charge(1000) {
					if u := b.Used(); u > b.Limit() {
						t.Errorf("pool at %d over its limit %d", u, b.Limit())
					}
					s.Release(1000)
				}
			}
		}()
	}
	wg.Wait()
	if b.Used() != 0 || b.Underflows() != 0 {
		t.Fatalf("pool %d, underflows %d", b.Used(), b.Underflows())
	}
}
