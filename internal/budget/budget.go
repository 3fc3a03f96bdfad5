// Package budget is the relay's one memory budget for bytes held on behalf of downstream peers
// (SPEC §15): queued answers, requests and stream frames waiting to be written, registrations at
// Cloudly. A Budget is the process-wide pool; each connection charges a Share of it, capped but not
// reserved. It does no I/O: it counts, refuses, and names the connection to evict when the pool
// is exhausted.
//
// Every charge is released exactly once, when its bytes are written or dropped; a release that
// would take a count below zero is a bug, counted in Underflows for tests to catch, and clamped.
package budget

import (
	"sync"
	"sync/atomic"
)

// Budget is the process-wide pool.
type Budget struct {
	limit      int64 // set at construction
	used       atomic.Int64
	underflows atomic.Int64
	evictions  atomic.Int64
	refusals   atomic.Int64

	mu     sync.Mutex
	shares map[*Share]struct{} // guarded by mu: the open shares, candidates for eviction
}

// New is a pool of limit bytes.
func New(limit int64) *Budget {
	return &Budget{limit: limit, shares: make(map[*Share]struct{})}
}

// Limit is the pool's size; Used what is charged now.
func (b *Budget) Limit() int64 { return b.limit }
func (b *Budget) Used() int64  { return b.used.Load() }

// Underflows counts releases of bytes that were never charged: always zero unless the relay's
// accounting is wrong.
func (b *Budget) Underflows() int64 { return b.underflows.Load() }

// Evictions counts connections closed to bring the pool back under its limit; Refusals counts
// charges refused because the pool was full.
func (b *Budget) Evictions() int64 { return b.evictions.Load() }
func (b *Budget) Refusals() int64  { return b.refusals.Load() }

// NewShare opens a share of at most limit bytes. stalled reports whether its peer is not reading
// (bytes are queued to it and none were written lately); evict closes its connection, gives back
// what is queued for it (its charges released) and must not block. Close the share when the
// connection ends.
func (b *Budget) NewShare(limit int64, stalled func() bool, evict func()) *Share {
	s := &Share{b: b, stalled: stalled, evict: evict}
	s.limit.Store(limit)
	b.mu.Lock()
	b.shares[s] = struct{}{}
	b.mu.Unlock()
	return s
}

func (b *Budget) take(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

func (b *Budget) give(n int64) {
	if b.used.Add(-n) < 0 {
		b.used.Add(n)
		b.underflows.Add(1)
	}
}

// reclaim closes the heaviest share whose peer is not reading, when the pool is over its limit
// or a charge did not fit: the one connection most responsible for the pressure goes first, and
// a peer that reads is never evicted for another's sake. It reports whether it evicted one; evict
// gives the victim's queued bytes back before it returns.
func (b *Budget) reclaim() bool {
	b.mu.Lock()
	var victim *Share
	for s := range b.shares {
		if s.evicted.Load() || s.used.Load() == 0 || (victim != nil && s.used.Load() <= victim.used.Load()) {
			continue
		}
		if s.stalled != nil && s.stalled() {
			victim = s
		}
	}
	if victim != nil {
		victim.evicted.Store(true)
		delete(b.shares, victim)
	}
	b.mu.Unlock()
	if victim == nil {
		return false
	}
	b.evictions.Add(1)
	victim.evict()
	return true
}

// Share is one connection's part of the pool.
type Share struct {
	b       *Budget     // set at construction
	stalled func() bool // set at construction
	evict   func()      // set at construction
	limit   atomic.Int64
	used    atomic.Int64
	evicted atomic.Bool
}

// SetLimit changes the share's cap (a connection that registers gets a larger one).
func (s *Share) SetLimit(n int64) { s.limit.Store(n) }

// Limit is the share's cap; Used what it holds now.
func (s *Share) Limit() int64 { return s.limit.Load() }
func (s *Share) Used() int64  { return s.used.Load() }

// Over reports whether the share holds more than its cap (forced charges can take it there).
func (s *Share) Over() bool { return s.used.Load() > s.limit.Load() }

// Charge takes n bytes when they fit both the share and the pool, and reports whether they did;
// nothing is charged when they do not. The first charge of an empty share fits its cap, so one
// message of any size the connection may send can always be carried.
func (s *Share) Charge(n int) bool {
	m := int64(n)
	for {
		u := s.used.Load()
		if u > 0 && u+m > s.limit.Load() {
			return false
		}
		if s.used.CompareAndSwap(u, u+m) {
			break
		}
	}
	// Past the pool, the heaviest non-reader goes first; this charge then gets one more try.
	if !s.b.take(m) && !(s.b.reclaim() && s.b.take(m)) {
		s.release(m)
		s.b.refusals.Add(1)
		return false
	}
	return true
}

// Force takes n bytes whatever the caps: an answer to the peer's own request, which may not be
// lost. When the pool is over its limit afterwards, the heaviest non-reading connection is evicted.
func (s *Share) Force(n int) {
	m := int64(n)
	s.used.Add(m)
	if s.b.used.Add(m) > s.b.limit {
		s.b.reclaim()
	}
}

// Release gives back n bytes charged earlier, when they were written or dropped.
func (s *Share) Release(n int) { s.release(int64(n)); s.b.give(int64(n)) }

func (s *Share) release(m int64) {
	if s.used.Add(-m) < 0 {
		s.used.Add(m)
		s.b.underflows.Add(1)
	}
}

// Close takes the share out of the eviction candidates. Bytes it still holds are released as they
// are written or dropped.
func (s *Share) Close() {
	s.b.mu.Lock()
	delete(s.b.shares, s)
	s.b.mu.Unlock()
}
