// Package budget is the relay's one memory budget for bytes held on behalf of downstream peers
// (docs/hostile.md): messages being received, queued answers, requests and stream frames waiting to be
// written, registrations at Cloudly, connections not yet upgraded. A Budget is the process-wide
// pool; each connection charges a Share of it, capped but not reserved. It does no I/O: it counts,
// refuses, makes a charge wait for room, and names the connection to evict when the pool is
// exhausted.
//
// Nothing is ever charged past a cap. Two rules keep an honest peer's small charges from being
// refused because of another peer's bytes:
//   - The reserve: the last Reserve (1/8) of the pool is kept for shares that hold little (at most
//     Small, 1/64 of the pool, with the charge: 4 MiB of the default 256). A peer that reads what it is sent and sends one
//     message at a time holds far less than that; a peer whose bytes pile up — in its own socket,
//     or behind Cloudly — is stopped at the reserve's edge.
//   - Eviction: when a charge does not fit, the share whose peer has the most bytes waiting on its
//     own socket, and has not read for a while, is evicted; bytes that wait behind Cloudly are
//     never a reason to evict anyone.
//
// Every charge is released exactly once, when its bytes are written or dropped; a release that
// would take a count below zero is a bug, counted in Underflows for tests to catch, and clamped.
package budget

import (
	"sync"
	"sync/atomic"
	"time"
)

// Budget is the process-wide pool.
type Budget struct {
	limit      int64 // set at construction
	reserve    int64 // set at construction: the pool's last bytes, for shares that hold little
	small      int64 // set at construction: what a share may hold and still draw on the reserve
	used       atomic.Int64
	underflows atomic.Int64
	evictions  atomic.Int64
	refusals   atomic.Int64

	mu     sync.Mutex
	shares map[*Share]struct{} // guarded by mu: the open shares, candidates for eviction

	// Waiters for room (ChargeWait): freed is closed, and replaced, by a release while waiters
	// are counted.
	waiters atomic.Int64
	freedMu sync.Mutex
	freed   chan struct{} // guarded by freedMu
}

// New is a pool of limit bytes.
func New(limit int64) *Budget {
	return &Budget{limit: limit, reserve: limit / 8, small: limit / 64, shares: make(map[*Share]struct{}), freed: make(chan struct{})}
}

// Limit is the pool's size; Used what is charged now.
func (b *Budget) Limit() int64 { return b.limit }
func (b *Budget) Used() int64  { return b.used.Load() }

// Reserve is the part of the pool kept for shares that hold at most Small.
func (b *Budget) Reserve() int64 { return b.reserve }
func (b *Budget) Small() int64   { return b.small }

// Underflows counts releases of bytes that were never charged: always zero unless the relay's
// accounting is wrong.
func (b *Budget) Underflows() int64 { return b.underflows.Load() }

// Evictions counts connections closed to bring the pool back under its limit; Refusals counts
// charges refused because the pool was full.
func (b *Budget) Evictions() int64 { return b.evictions.Load() }
func (b *Budget) Refusals() int64  { return b.refusals.Load() }

// Waiters counts the charges waiting for room now (ChargeWait, ChargeIncoming, WaitFor).
func (b *Budget) Waiters() int64 { return b.waiters.Load() }

// Waiting reports, for a share's peer, the bytes it holds that wait on the peer's own socket and
// whether the peer has read nothing lately. A share without one is never evicted.
type Waiting func() (ownBytes int64, stalled bool)

// NewShare opens a share of at most limit bytes. waiting tells eviction where its bytes wait
// (nil: never evicted); evict closes its connection, gives back what is queued for it (its charges
// released) and must not block. Close the share when the connection ends.
func (b *Budget) NewShare(limit int64, waiting Waiting, evict func()) *Share {
	s := &Share{b: b, waiting: waiting, evict: evict}
	s.limit.Store(limit)
	b.mu.Lock()
	b.shares[s] = struct{}{}
	b.mu.Unlock()
	return s
}

// take charges n to the pool if they fit: all of it for a share that holds little (holding, with
// n), all but the reserve for any other.
func (b *Budget) take(n, holding int64) bool {
	limit := b.limit
	if holding > b.small {
		limit -= b.reserve
	}
	for {
		u := b.used.Load()
		if u+n > limit {
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
	if b.waiters.Load() > 0 {
		b.freedMu.Lock()
		close(b.freed)
		b.freed = make(chan struct{})
		b.freedMu.Unlock()
	}
}

// room is closed by the next release anywhere in the pool.
func (b *Budget) room() <-chan struct{} {
	b.freedMu.Lock()
	defer b.freedMu.Unlock()
	return b.freed
}

// reclaim evicts, when a charge did not fit, the share whose peer has the most bytes waiting on
// its own socket and reads nothing — or, while none has read nothing for long enough to tell, the
// one with the most bytes waiting on its own socket if they are more than Small: a peer that reads
// what it is sent holds little there. The one connection most responsible for the pressure goes
// first, and bytes waiting behind Cloudly count for no one. It reports whether it evicted one;
// evict gives the victim's queued bytes back before it returns.
func (b *Budget) reclaim() bool {
	b.mu.Lock()
	var stalledVictim, heavyVictim *Share
	var stalledMost, heavyMost int64
	for s := range b.shares {
		if s.waiting == nil || s.evicted.Load() {
			continue
		}
		own, stalled := s.waiting()
		if stalled && own > stalledMost {
			stalledVictim, stalledMost = s, own
		}
		if own > b.small && own > heavyMost {
			heavyVictim, heavyMost = s, own
		}
	}
	victim := stalledVictim
	if victim == nil {
		victim = heavyVictim
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

// NewPartition opens a share that bounds a class of peers together (those that have not
// registered): its cap applies to every charge, a message being received included, and it is never
// evicted.
func (b *Budget) NewPartition(limit int64) *Share {
	s := b.NewShare(limit, nil, nil)
	s.partition = true
	return s
}

// Share is one connection's part of the pool.
type Share struct {
	b         *Budget // set at construction
	waiting   Waiting // set at construction
	evict     func()  // set at construction
	partition bool    // set at construction: its cap bounds incoming bytes too
	limit     atomic.Int64
	used      atomic.Int64
	evicted   atomic.Bool
}

// SetLimit changes the share's cap (a connection that registers gets a larger one).
func (s *Share) SetLimit(n int64) { s.limit.Store(n) }

// Limit is the share's cap; Used what it holds now.
func (s *Share) Limit() int64 { return s.limit.Load() }
func (s *Share) Used() int64  { return s.used.Load() }

// Charge takes n bytes when they fit both the share and the pool, and reports whether they did;
// nothing is charged when they do not. The first charge of an empty share fits its cap, so one
// message of any size the connection may send can always be carried.
func (s *Share) Charge(n int) bool {
	m := int64(n)
	holding, ok := s.takeShare(m)
	if !ok {
		return false
	}
	// Past the pool, the heaviest non-reader goes first; this charge then gets one more try.
	if !s.b.take(m, holding) && !(s.b.reclaim() && s.b.take(m, holding)) {
		s.release(m)
		s.b.refusals.Add(1)
		return false
	}
	return true
}

// ChargeWait is Charge that waits for room instead of refusing, until either done channel is
// closed (then it charges nothing and reports false). It blocks its caller: a peer's read loop
// uses it to leave the peer's next bytes on its own socket while its earlier ones wait.
func (s *Share) ChargeWait(n int, done1, done2 <-chan struct{}) bool {
	return s.wait(func() bool { return s.Charge(n) }, done1, done2)
}

// ChargeIncoming charges n bytes of a message being received, waiting for room in the pool until
// done is closed (false: nothing charged). A connection's share's cap does not apply: the message
// must be read before it can be refused by name, and it is charged only until it is read whole;
// the pool, at its reserve's edge for a share that holds more than Small, bounds what every
// message being received holds together. A partition's cap does apply.
func (s *Share) ChargeIncoming(n int, done <-chan struct{}) bool {
	if s.partition {
		return s.ChargeWait(n, done, nil)
	}
	m := int64(n)
	charge := func() bool {
		if s.b.take(m, s.used.Add(m)) {
			return true
		}
		s.release(m)
		return false
	}
	return s.wait(func() bool { return charge() || s.b.reclaim() && charge() }, done, nil)
}

// retryEvery is how often a waiting charge tries again when nothing is released: a peer that
// holds the pool may only now count as not reading, and the try evicts it.
const retryEvery = 50 * time.Millisecond

// wait tries charge until it succeeds, trying again after every release in the pool and every
// retryEvery, until either done channel is closed.
func (s *Share) wait(charge func() bool, done1, done2 <-chan struct{}) bool {
	return s.b.WaitFor(charge, done1, done2)
}

// WaitFor tries charge until it reports true, trying again after every release in the pool and
// every retryEvery, until either done channel is closed (then false): a charge with a rule of its
// own — making room before it tries — waits as ChargeWait does.
func (b *Budget) WaitFor(charge func() bool, done1, done2 <-chan struct{}) bool {
	if charge() {
		return true
	}
	b.waiters.Add(1)
	defer b.waiters.Add(-1)
	retry := time.NewTicker(retryEvery)
	defer retry.Stop()
	for {
		room := b.room() // before the try: a release between the two still wakes us
		if charge() {
			return true
		}
		select {
		case <-room:
		case <-retry.C:
		case <-done1:
			return false
		case <-done2:
			return false
		}
	}
}

// takeShare charges m to the share if it fits its cap, and returns what the share holds with it.
func (s *Share) takeShare(m int64) (int64, bool) {
	for {
		u := s.used.Load()
		if u > 0 && u+m > s.limit.Load() {
			return u, false
		}
		if s.used.CompareAndSwap(u, u+m) {
			return u + m, true
		}
	}
}

// Refusal charges a refusal the relay answers with itself (encoded, a few hundred bytes; the
// caller bounds it) whatever the caps: refusing to send a refusal would leave the request
// unanswered. Their number is bounded by the requests a connection may have in flight, so together
// they hold at most that many small frames.
func (s *Share) Refusal(n int) {
	s.used.Add(int64(n))
	s.b.used.Add(int64(n))
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
