package daemon

import (
	"runtime"
	"testing"
)

func TestGCPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, ceiling uint64
		want          int
	}{
		{10 * mib, 80 * mib, gcPercentMax}, // room for 7× the live heap: capped
		{16 * mib, 80 * mib, gcPercentMax}, // exactly 4× of room
		{20 * mib, 80 * mib, 300},          // the heap may triple before the next cycle
		{40 * mib, 80 * mib, gcPercentMin}, // only doubling fits: Go's default
		{60 * mib, 80 * mib, gcPercentMin}, // less room than the default would take: never below it
		{90 * mib, 80 * mib, gcPercentMin}, // past the ceiling
		{0, 80 * mib, gcPercentMin},        // no reading yet
	} {
		if got := gcPercentFor(c.live, c.ceiling); got != c.want {
			t.Errorf("gcPercentFor(%d MiB, %d MiB) = %d, want %d", c.live/mib, c.ceiling/mib, got, c.want)
		}
	}
}

// The tuner sets the percent after a collection from the live heap it left, and once stopped
// gives back the percent it found and sets nothing more.
func TestGCTunerFollowsEveryCycle(t *testing.T) {
	sets := make(chan int, 64)
	current := 100
	set := func(p int) int {
		old := current
		current = p
		sets <- p
		return old
	}
	// A ceiling far above any live heap this test has: every cycle asks for the most.
	stop := startGCTuner(1<<50, set)
	if p := <-sets; p != gcPercentMin {
		t.Fatalf("first set %d, want %d until a cycle has been seen", p, gcPercentMin)
	}
	for p := 0; p != gcPercentMax; {
		runtime.GC()
		select {
		case p = <-sets:
		default:
		}
	}
	stop()
	if p := <-sets; p != gcPercentMin {
		t.Fatalf("stop set %d, want the percent from before (%d)", p, gcPercentMin)
	}
	runtime.GC()
	runtime.GC()
	select {
	case p := <-sets:
		t.Fatalf("set %d after stop", p)
	default:
	}
}
