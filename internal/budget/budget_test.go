package budget

import (
	"sync"
	"testing"
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
	b := New(100)
	var evicted []string
	share := func(name string, stalled bool) *Share {
		return b.NewShare(1000, func() bool { return stalled }, func() { evicted = append(evicted, name) })
	}
	light, heavy, reading := share("light-stalled", true), share("heavy-stalled", true), share("heavy-reading", false)
	light.Charge(10)
	heavy.Charge(30)
	reading.Charge(50)
	if reading.Charge(20) {
		t.Fatal("a charge beyond the pool fitted")
	}
	if b.Refusals() != 1 || len(evicted) != 1 || evicted[0] != "heavy-stalled" {
		t.Fatalf("refusals %d, evicted %v: want the heaviest non-reading share evicted, never a reading one", b.Refusals(), evicted)
	}
	// A forced charge may take the pool over its limit, and evicts the next heaviest non-reader.
	reading.Force(20)
	if b.Used() != 110 || len(evicted) != 2 || evicted[1] != "light-stalled" {
		t.Fatalf("pool %d, evicted %v", b.Used(), evicted)
	}
	// Nothing stalled is left: the pool stays over, refusing, and evicts no reader.
	if light.Charge(1) || len(evicted) != 2 {
		t.Fatalf("evicted %v", evicted)
	}
	for _, s := range []*Share{light, heavy, reading} {
		s.Release(int(s.Used()))
		s.Close()
	}
	if b.Used() != 0 || b.Underflows() != 0 || b.Evictions() != 2 {
		t.Fatalf("pool %d, underflows %d, evictions %d", b.Used(), b.Underflows(), b.Evictions())
	}
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
