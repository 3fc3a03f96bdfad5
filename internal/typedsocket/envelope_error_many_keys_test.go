package typedsocket

import (
	"strconv"
	"testing"
	"time"
)

// TestDecodeErrorWithManyKeysIsCheap: Decode runs on the read loop for every frame any peer sends,
// a registered node's up to --max-message-bytes (8 MiB, SPEC §2) and an anonymous one's up to
// 64 KiB. An answer whose error object carries many keys is malformed, but reading it must not
// cost members² key comparisons (contracts.ReadObject's repeated-key check): 100 000 keys, under
// 1 MB, took tens of seconds of one core, and the read loop answered nothing meanwhile.
// Judged by growth in the same run, not by wall time: 16 times the keys costs about 16 times as
// much when linear and 256 times when quadratic.
func TestDecodeErrorWithManyKeysIsCheap(t *testing.T) {
	cost := func(n int) time.Duration {
		frame := []byte(`{"method":"m","request":{},"response":null,"correlation":{"id":"x","phase":"response"},"error":{"text":"t"`)
		for i := range n {
			frame = append(frame, `,"`...)
			frame = strconv.AppendInt(frame, int64(i), 36)
			frame = append(frame, `":0`...)
		}
		frame = append(frame, "}}"...)
		best := time.Duration(1<<63 - 1)
		for range 3 {
			start := time.Now()
			_, err := Decode(frame)
			best = min(best, time.Since(start))
			if err == nil {
				t.Fatal("Decode accepted an error object with unknown keys")
			}
		}
		return best
	}
	small, large := cost(4_000), cost(64_000)
	if growth := float64(large) / float64(small); growth > 64 {
		t.Fatalf("16× the keys cost %.0f× as much (%v → %v): reading the error object is quadratic", growth, small, large)
	}
}
