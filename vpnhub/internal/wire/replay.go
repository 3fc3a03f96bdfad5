package wire

import "math"

// The receive side's sliding replay window (docs/protocol.md#vpn-hub: at least 2048 counters). A bitmap ring of
// replayWords 64-bit words, the newest of them holding the highest counter accepted: a counter is
// new when it is above that, or within ReplayWindowSize below it and not yet marked. The window is
// checked before the AEAD opens a datagram and marked only after it authenticated, so a forged
// datagram cannot move it.

const (
	replayWords = 64 // a power of two
	// ReplayWindowSize is how many counters below the highest accepted one are still judged by
	// the bitmap; anything older is refused as replayed.
	ReplayWindowSize = (replayWords - 1) * 64
)

// ReplayWindow is owned by one goroutine (the opener's); it is not safe for concurrent use.
type ReplayWindow struct {
	last uint64 // highest counter accepted; 0 before the first
	ring [replayWords]uint64
}

// Check reports whether counter may be accepted. Counter 0 never is (counters start at 1), nor
// the all-ones counter, which Noise reserves.
func (w *ReplayWindow) Check(counter uint64) bool {
	if counter == 0 || counter == math.MaxUint64 {
		return false
	}
	if counter > w.last {
		return true
	}
	if w.last-counter >= ReplayWindowSize {
		return false
	}
	return w.ring[(counter>>6)&(replayWords-1)]&(1<<(counter&63)) == 0
}

// Accept marks counter seen. Call it only after Check passed and the datagram authenticated.
func (w *ReplayWindow) Accept(counter uint64) {
	if counter > w.last {
		cur, next := w.last>>6, counter>>6
		clear := next - cur
		if clear > replayWords {
			clear = replayWords
		}
		for i := uint64(1); i <= clear; i++ {
			w.ring[(cur+i)&(replayWords-1)] = 0
		}
		w.last = counter
	}
	w.ring[(counter>>6)&(replayWords-1)] |= 1 << (counter & 63)
}
