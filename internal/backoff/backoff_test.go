package backoff

import (
	"testing"
	"time"
)

func TestBackoffCeilingDoublesToTheCap(t *testing.T) {
	var ceilings []time.Duration
	b := &Backoff{rand: func(n int64) int64 { ceilings = append(ceilings, time.Duration(n-1)); return n - 1 }}
	for range 10 {
		b.Next()
	}
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second,
		8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second, 30 * time.Second}
	for i := range want {
		if ceilings[i] != want[i] {
			t.Fatalf("ceilings = %v, want %v", ceilings, want)
		}
	}
	b.Reset()
	if d := b.Next(); d != 250*time.Millisecond {
		t.Fatalf("after reset: %v", d)
	}
}

func TestBackoffIsFullJitter(t *testing.T) {
	b := &Backoff{rand: func(int64) int64 { return 0 }}
	for range 30 {
		if d := b.Next(); d != 0 {
			t.Fatalf("full jitter allows a zero wait, got %v", d)
		}
	}
	real := New()
	for range 1000 {
		if d := real.Next(); d < 0 || d > Cap {
			t.Fatalf("wait %v outside [0, cap]", d)
		}
	}
}
