package relay

import (
	"fmt"
	"testing"
	"time"
)

// TestSourceRates: a bucket per source address, burst then rate; time is given, not waited for.
func TestSourceRates(t *testing.T) {
	s := newSourceRates(DefaultUpgradeRatePerSource, DefaultUpgradeBurstPerSource)
	now := time.Unix(1_000_000, 0)
	for i := range DefaultUpgradeBurstPerSource {
		if !s.allow("192.0.2.1", now) {
			t.Fatalf("upgrade %d of a burst of %d refused", i+1, DefaultUpgradeBurstPerSource)
		}
	}
	if s.allow("192.0.2.1", now) {
		t.Fatal("an upgrade past the burst admitted")
	}
	if !s.allow("192.0.2.2", now) {
		t.Fatal("another address shares the first one's bucket")
	}
	if s.allow("192.0.2.1", now.Add(200*time.Millisecond)) {
		t.Fatal("admitted again after 200 ms at 4 a second")
	}
	if !s.allow("192.0.2.1", now.Add(250*time.Millisecond)) {
		t.Fatal("refused after 250 ms at 4 a second")
	}
}

// TestSourceRatesBounded: the buckets kept are bounded; refilled ones make room, and while none
// has, a new address is refused rather than kept.
func TestSourceRatesBounded(t *testing.T) {
	s := newSourceRates(DefaultUpgradeRatePerSource, DefaultUpgradeBurstPerSource)
	now := time.Unix(1_000_000, 0)
	for i := range maxRateSources {
		s.allow(fmt.Sprintf("10.%d.%d.1", i>>8, i&0xff), now)
	}
	if s.allow("192.0.2.1", now) {
		t.Fatal("a new address admitted with every bucket kept still spending")
	}
	if n := s.len(); n != maxRateSources {
		t.Fatalf("%d buckets kept, want %d", n, maxRateSources)
	}
	later := now.Add(time.Second) // 4 tokens back of 1 spent: every bucket full again
	if !s.allow("192.0.2.1", later) {
		t.Fatal("refused once the buckets had refilled")
	}
	if n := s.len(); n != 1 {
		t.Fatalf("%d buckets kept after the sweep, want 1", n)
	}
}
