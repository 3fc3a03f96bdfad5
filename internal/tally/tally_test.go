package tally

import (
	"maps"
	"sync"
	"testing"
)

// TestTally: counts what is in its vocabulary, ignores the rest, and is safe to add to from many
// goroutines while a snapshot is taken.
func TestTally(t *testing.T) {
	tl := New([]string{"accepted", "refused"})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				tl.Add("accepted")
				tl.Add("not-a-name")
				tl.Snapshot()
			}
		})
	}
	wg.Wait()
	tl.Add("refused")
	want := map[string]int64{"accepted": 800, "refused": 1}
	if got := tl.Snapshot(); !maps.Equal(got, want) {
		t.Fatalf("snapshot = %v, want %v", got, want)
	}
}
