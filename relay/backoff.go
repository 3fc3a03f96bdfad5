package relay

import (
	"math/rand/v2"
	"time"
)

// Reconnect backoff toward Cloudly (project-defined, SPEC §4): exponential from 250 ms to a 30 s
// cap with full jitter — each wait is uniform in [0, min(cap, base·2^attempt)] — so a fleet of
// relays that lost Cloudly together does not return together.
const (
	backoffBase = 250 * time.Millisecond
	backoffCap  = 30 * time.Second
)

// backoff is the retry schedule; no I/O, randomness injected. Owned by the upstream loop.
type backoff struct {
	attempt int
	rand    func(n int64) int64 // uniform in [0, n)
}

func newBackoff() *backoff { return &backoff{rand: rand.Int64N} }

// next returns the wait before the next attempt and advances the schedule.
func (b *backoff) next() time.Duration {
	ceiling := backoffCap
	if b.attempt < 20 { // 250 ms · 2^7 already exceeds the cap; avoid overflow beyond
		if c := backoffBase << b.attempt; c < backoffCap {
			ceiling = c
		}
	}
	b.attempt++
	return time.Duration(b.rand(int64(ceiling) + 1))
}

// reset starts the schedule again after a successful attach.
func (b *backoff) reset() { b.attempt = 0 }
