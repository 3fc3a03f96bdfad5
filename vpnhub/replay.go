package vpnhub

import "math"

// The receive side's sliding replay window (SPEC §7: at least 2048 counters). A bitmap ring of
// replayWords 64-bit words, the newest of them holding the highest counter accepted: a counter is
// new when it is above that, or within ReplayWindow below it and not yet marked. The window is
// checked before the AEAD opens a datagram and marked only after it authenticated, so a forged
// datagram cannot move it.

const (
	replayWords = 64 // a power of two
	// ReplayWindow is how many counters below the highest accepted one are still judged by the
	// bitmap; anything older is refused as replayed.
	ReplayWindow = (replayWords - 1) * 64
)

// replayWindow is owned by one forward loop; it is not safe for concurrent use.
type replayWindow struct {
	last uint64 // highest counter accepted; 0 before the first
	ring [replayWords]uint64
}

// check reports whether counter may be accepted. Counter 0 never is (counters start at 1), nor
// the all-ones counter, which Noise reserves.
func (w *replayWindow) check(counter uint64) bool {
	if counter == 0 || counter == math.MaxUint64 {
		return false
	}
	if counter > w.last {
		return true
	}
	if w.last-counter >= ReplayWindow {
		return false
	}
	return w.ring[(counter>>6)&(replayWords-1)]&(1<<(counter&63)) == 0
}

// accept marks counter seen. Call it only after check passed and the datagram authenticated.
func (w *replayWindow) accept(counter uint64) {
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
