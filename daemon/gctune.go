package daemon

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// The collector's percent the relay chooses after each cycle (docs/decisions.md, "The relay's
// collector spaces its cycles by the room it has"): never below Go's default, so the relay never
// collects more often than an untuned one would, and at most gcPercentMax, past which fewer
// cycles buy little and a cycle's mark work grows with the garbage it finds.
const (
	gcPercentMin = 100
	gcPercentMax = 400
)

// heapMargin is the heap the relay is allowed above its peer budget (docs/hostile.md, "How it is
// proven"): escrow, routes, the registry cache's index and the garbage between two collections.
// The tuner aims at three quarters of the budget and the margin together: the heap overshoots its
// goal by what is allocated while a cycle marks, and under a flood that is megabytes.
const (
	heapMargin = 64 << 20
	heapAim    = 0.75
)

// gcPercentFor is the collector's percent that lets the heap grow from live to at most ceiling
// before the next cycle, within [gcPercentMin, gcPercentMax].
func gcPercentFor(live, ceiling uint64) int {
	if live == 0 || ceiling <= live {
		return gcPercentMin
	}
	p := (ceiling - live) * 100 / live
	return int(max(gcPercentMin, min(p, gcPercentMax)))
}

// gcTuner sets the collector's percent after every cycle from the live heap that cycle left and
// the heap the relay may reach. Under a flood the live heap is small beside that room, so the
// relay collects up to four times less often than at Go's default: each cycle's mark phase takes
// the relay's core for milliseconds, and the honest nodes' requests wait behind it
// (bench/RESULTS.md, "Hostile load, fifth pass"). It sets no memory limit, so a live heap past
// the ceiling is collected as Go's default would: never a collector that runs without end.
type gcTuner struct {
	ceiling uint64
	set     func(int) int // debug.SetGCPercent
	sample  []metrics.Sample

	mu      sync.Mutex // stop against a cycle's set
	last    int
	stopped bool
}

// sentinel is garbage made for the collector to find: its cleanup marks the end of a cycle. It
// holds a pointer so that it is not one of the runtime's tiny allocations, which may never be
// cleaned up on their own.
type sentinel struct {
	_ *gcTuner
	_ [8]byte
}

// tuneGC starts a tuner for a relay whose peer budget is budget, unless GOGC is set, which is the
// operator's choice. The heap may reach three quarters of the budget and its margin, or the
// runtime's soft memory limit (the container's or GOMEMLIMIT) where that is lower. It returns a func that stops the
// tuner and gives the collector back its percent from before.
func tuneGC(budget int64) (stop func()) {
	if _, ok := os.LookupEnv("GOGC"); ok || budget <= 0 {
		return func() {}
	}
	ceiling := uint64(float64(budget+heapMargin) * heapAim)
	if soft := debug.SetMemoryLimit(-1); soft > 0 && uint64(soft) < ceiling {
		ceiling = uint64(soft)
	}
	return startGCTuner(ceiling, debug.SetGCPercent)
}

func startGCTuner(ceiling uint64, set func(int) int) (stop func()) {
	t := &gcTuner{ceiling: ceiling, set: set, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	before := t.set(gcPercentMin)
	t.last = gcPercentMin
	t.arm()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if !t.stopped {
			t.stopped = true
			t.set(before)
		}
	}
}

// arm makes a sentinel whose cleanup runs once the next cycle has found it unreachable.
func (t *gcTuner) arm() {
	runtime.AddCleanup(&sentinel{}, func(t *gcTuner) { t.cycle() }, t)
}

// cycle runs once per collection, on the runtime's cleanup goroutine.
func (t *gcTuner) cycle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	metrics.Read(t.sample)
	if t.sample[0].Value.Kind() == metrics.KindUint64 {
		if p := gcPercentFor(t.sample[0].Value.Uint64(), t.ceiling); p != t.last {
			t.set(p)
			t.last = p
		}
	}
	t.arm()
}
