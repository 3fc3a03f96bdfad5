// Package backoff is the one retry schedule of the relay and its clients (project-defined,
// docs/protocol.md#upstream-session): exponential from 250 ms to a 30 s cap with full jitter — each wait is uniform in
// [0, min(cap, base·2^attempt)] — so a fleet that lost its peer together does not return together.
// It does no I/O and reads no clock; randomness is injected.
package backoff

import (
	"math/rand/v2"
	"time"
)

// The schedule's bounds.
const (
	Base = 250 * time.Millisecond
	Cap  = 30 * time.Second
)

// Backoff is the retry schedule. Owned by one retry loop.
type Backoff struct {
	attempt int
	rand    func(n int64) int64 // uniform in [0, n)
}

// New is a schedule with real randomness.
func New() *Backoff { return &Backoff{rand: rand.Int64N} }

// Next returns the wait before the next attempt and advances the schedule.
func (b *Backoff) Next() time.Duration {
	ceiling := Cap
	if b.attempt < 20 { // 250 ms · 2^7 already exceeds the cap; avoid overflow beyond
		if c := Base << b.attempt; c < Cap {
			ceiling = c
		}
	}
	b.attempt++
	return time.Duration(b.rand(int64(ceiling) + 1))
}

// Reset starts the schedule again after a success.
func (b *Backoff) Reset() { b.attempt = 0 }
