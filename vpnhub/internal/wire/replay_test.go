package wire

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
	if c == 0 || c == math.MaxUint64 || n.seen[c] || (c <= n.last && n.last-c >= ReplayWindowSize) {
		return false
	}
	n.seen[c] = true
	n.last = max(n.last, c)
	return true
}

func TestReplayWindowIsAtLeast2048(t *testing.T) {
	if ReplayWindowSize < 2048 {
		t.Fatalf("ReplayWindowSize = %d; docs/protocol.md#vpn-hub wants at least 2048", ReplayWindowSize)
	}
	var w ReplayWindow
	w.Accept(5000)
	if !w.Check(5000-2047) || w.Check(5000) {
		t.Fatal("a counter 2047 below the newest must still be accepted once")
	}
}

func TestReplayWindowMatchesNaiveReference(t *testing.T) {
	for seed := uint64(0); seed < 50; seed++ {
		r := rand.New(rand.NewPCG(seed, seed*7+1))
		var w ReplayWindow
		ref := naiveWindow{seen: map[uint64]bool{}}
		var base uint64 = 1
		for i := 0; i < 20000; i++ {
			var c uint64
			switch k := r.IntN(100); {
			case k < 50: // near the front, out of order
				c = base + uint64(r.IntN(64))
				base++
			case k < 70: // a duplicate or a late one inside the window
				c = ref.last - uint64(r.IntN(ReplayWindowSize+200))
			case k < 80: // exactly at the window's edges
				c = ref.last - ReplayWindowSize + uint64(r.IntN(3)) - 1
			case k < 85: // far in the future
				c = ref.last + uint64(r.IntN(1<<20)) + ReplayWindowSize
				base = c
			case k < 90: // far in the past
				c = r.Uint64N(ref.last/2 + 1)
			case k < 92:
				c = []uint64{0, math.MaxUint64}[r.IntN(2)]
			default: // a plain duplicate of the newest
				c = ref.last
			}
			want := ref.accept(c)
			got := w.Check(c)
			if got {
				w.Accept(c)
			}
			if got != want {
				t.Fatalf("seed %d step %d: counter %d (newest %d): window says %v, reference %v", seed, i, c, ref.last, got, want)
			}
		}
		for _, c := range []uint64{math.MaxUint64 - 1, math.MaxUint64 - 1, math.MaxUint64 - ReplayWindowSize, math.MaxUint64 - ReplayWindowSize + 1} {
			want, got := ref.accept(c), w.Check(c)
			if got {
				w.Accept(c)
			}
			if got != want {
				t.Fatalf("seed %d: counter %d at the top: window says %v, reference %v", seed, c, got, want)
			}
		}
	}
}

func BenchmarkReplayWindow(b *testing.B) {
	var w ReplayWindow
	for i := uint64(1); i <= uint64(b.N); i++ {
		c := i ^ 3
		if w.Check(c) {
			w.Accept(c)
		}
	}
}
