package vpnhub

import (
	"math"
	"math/rand/v2"
	"testing"
)

// naiveWindow is the slow reference: a set of every counter seen.
type naiveWindow struct {
	last uint64
	seen map[uint64]bool
}

func (n *naiveWindow) accept(c uint64) bool {
	if c == 0 || c == math.MaxUint64 || n.seen[c] || (c <= n.last && n.last-c >= ReplayWindow) {
		return false
	}
	n.seen[c] = true
	n.last = max(n.last, c)
	return true
}

func TestReplayWindowIsAtLeast2048(t *testing.T) {
	if ReplayWindow < 2048 {
		t.Fatalf("ReplayWindow = %d; SPEC §7 wants at least 2048", ReplayWindow)
	}
	var w replayWindow
	w.accept(5000)
	if !w.check(5000-2047) || w.check(5000) {
		t.Fatal("a counter 2047 below the newest must still be accepted once")
	}
}

func TestReplayWindowMatchesNaiveReference(t *testing.T) {
	for seed := uint64(0); seed < 50; seed++ {
		r := rand.New(rand.NewPCG(seed, seed*7+1))
		var w replayWindow
		ref := naiveWindow{seen: map[uint64]bool{}}
		var base uint64 = 1
		for i := 0; i < 20000; i++ {
			var c uint64
			switch k := r.IntN(100); {
			case k < 50: // near the front, out of order
				c = base + uint64(r.IntN(64))
				base++
			case k < 70: // a duplicate or a late one inside the window
				c = ref.last - uint64(r.IntN(ReplayWindow+200))
			case k < 80: // exactly at the window's edges
				c = ref.last - ReplayWindow + uint64(r.IntN(3)) - 1
			case k < 85: // far in the future
				c = ref.last + uint64(r.IntN(1<<20)) + ReplayWindow
				base = c
			case k < 90: // far in the past
				c = r.Uint64N(ref.last/2 + 1)
			case k < 92:
				c = []uint64{0, math.MaxUint64}[r.IntN(2)]
			default: // a plain duplicate of the newest
				c = ref.last
			}
			want := ref.accept(c)
			got := w.check(c)
			if got {
				w.accept(c)
			}
			if got != want {
				t.Fatalf("seed %d step %d: counter %d (newest %d): window says %v, reference %v", seed, i, c, ref.last, got, want)
			}
		}
		for _, c := range []uint64{math.MaxUint64 - 1, math.MaxUint64 - 1, math.MaxUint64 - ReplayWindow, math.MaxUint64 - ReplayWindow + 1} {
			want, got := ref.accept(c), w.check(c)
			if got {
				w.accept(c)
			}
			if got != want {
				t.Fatalf("seed %d: counter %d at the top: window says %v, reference %v", seed, c, got, want)
			}
		}
	}
}

func BenchmarkReplayWindow(b *testing.B) {
	var w replayWindow
	for i := uint64(1); i <= uint64(b.N); i++ {
		c := i ^ 3
		if w.check(c) {
			w.accept(c)
		}
	}
}
