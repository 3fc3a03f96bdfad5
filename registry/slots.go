package registry

import (
	"container/list"
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Slots (docs/hostile.md, "/v2/ fairness"). Every request the registry sends upstream holds a slot of a
// pool for as long as it holds the upstream connection, charged to the caller's source address
// (the TCP peer, never a header): at most perSource per address and total in all. There are two
// pools, so that the one that serves cache hits never waits behind the other:
//
//	fetch      forwards (HEAD, tags, uploads, queries, Range misses) and fills: held until the
//	           upstream's answer is closed, so a forward's slot lasts as long as its caller reads
//	authorize  the authorization HEAD before a hit or a join: held for the HEAD alone
//
// A caller whose source or the pool is full waits, at most the slot wait, then is refused 503
// registry-upstream-busy with Retry-After. Waiters are granted round-robin by source, each
// source's oldest first, so an address with a thousand requests queued delays another address's
// request by at most one grant each; a grant skips only sources at their own limit, and there are
// at most total/perSource of those. Memory is one entry per source that holds or waits for a
// slot, and one per waiting request: bounded by the connections the listener admits.
type slotPool struct {
	name      string             // set at construction: the metric label, fetch or authorize
	perSource int                // set at construction
	total     int                // set at construction
	inUse     prometheus.Gauge   // set at construction: relay_registry_slots_in_use{pool}
	refused   func(limit string) // set at construction: counts a wait refused at a limit
	mu        sync.Mutex
	held      int                 // guarded by mu: slots held in all
	sources   map[string]*slotSrc // guarded by mu: sources holding or waiting for a slot
	ring      list.List           // guarded by mu: *slotSrc with waiters, next to be granted first
}

// slotSrc is one source address's share of a pool.
type slotSrc struct {
	key     string        // set at construction
	held    int           // guarded by the pool's mu
	waiters list.List     // guarded by the pool's mu: *slotWaiter, oldest first
	ringEl  *list.Element // guarded by the pool's mu: its place in the ring while it has waiters
}

type slotWaiter struct {
	granted chan struct{} // closed, under the pool's mu, when the slot is the waiter's
	el      *list.Element // guarded by the pool's mu: its place in its source's waiters
}

func newSlotPool(name string, perSource, total int, inUse prometheus.Gauge, refused func(limit string)) *slotPool {
	return &slotPool{name: name, perSource: perSource, total: total, inUse: inUse, refused: refused,
		sources: make(map[string]*slotSrc)}
}

// slot is one slot held; release gives it back, once, however often it is called.
type slot struct {
	p        *slotPool   // set at construction
	s        *slotSrc    // set at construction
	released atomic.Bool // set by the first release
}

func (sl *slot) release() {
	if sl == nil || !sl.released.CompareAndSwap(false, true) {
		return
	}
	p := sl.p
	p.mu.Lock()
	defer p.mu.Unlock()
	sl.s.held--
	p.held--
	p.grantLocked()
	p.forgetLocked(sl.s)
	p.inUse.Set(float64(p.held))
}

// errSlotBusy is a wait for a slot that ran out: the pool, the limit the caller waited on and
// its size.
type errSlotBusy struct {
	pool, limit string // set at construction: fetch or authorize; source or total
	n           int    // set at construction: the limit's size
}

func (e *errSlotBusy) Error() string {
	return fmt.Sprintf("no %s slot within the slot wait: the %s limit (%d)", e.pool, e.limit, e.n)
}

// Limits a refused wait names (metric label values).
const (
	limitSource = "source"
	limitTotal  = "total"
)

// acquire takes a slot for source, waiting at most wait. It fails with an *errSlotBusy when the
// wait ran out, and with ctx's error when the caller left first.
func (p *slotPool) acquire(ctx context.Context, source string, wait time.Duration) (*slot, error) {
	p.mu.Lock()
	s := p.sources[source]
	if s == nil {
		s = &slotSrc{key: source}
		p.sources[source] = s
	}
	if s.waiters.Len() == 0 && s.held < p.perSource && p.held < p.total {
		p.takeLocked(s)
		p.mu.Unlock()
		return &slot{p: p, s: s}, nil
	}
	w := &slotWaiter{granted: make(chan struct{})}
	w.el = s.waiters.PushBack(w)
	if s.ringEl == nil {
		s.ringEl = p.ring.PushBack(s)
	}
	p.mu.Unlock()

	timer := time.NewTimer(wait)
	defer timer.Stop()
	var err error
	select {
	case <-w.granted:
		return &slot{p: p, s: s}, nil
	case <-timer.C:
	case <-ctx.Done():
		err = ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-w.granted: // granted as the wait ended: the slot is the caller's all the same
		return &slot{p: p, s: s}, nil
	default:
	}
	s.waiters.Remove(w.el)
	if s.waiters.Len() == 0 {
		p.ring.Remove(s.ringEl)
		s.ringEl = nil
	}
	p.forgetLocked(s)
	if err != nil {
		return nil, err
	}
	busy := &errSlotBusy{pool: p.name, limit: limitTotal, n: p.total}
	if s.held >= p.perSource {
		busy.limit, busy.n = limitSource, p.perSource
	}
	p.refused(busy.limit)
	return nil, busy
}

// takeLocked charges one slot to s.
func (p *slotPool) takeLocked(s *slotSrc) {
	s.held++
	p.held++
	p.inUse.Set(float64(p.held))
}

// grantLocked hands free slots to waiters: round-robin over the sources that wait, skipping those
// at their own limit.
func (p *slotPool) grantLocked() {
	for p.held < p.total {
		var next *slotSrc
		for el := p.ring.Front(); el != nil; el = el.Next() {
			if s := el.Value.(*slotSrc); s.held < p.perSource {
				next = s
				break
			}
		}
		if next == nil {
			return
		}
		w := next.waiters.Remove(next.waiters.Front()).(*slotWaiter)
		p.ring.Remove(next.ringEl)
		next.ringEl = nil
		if next.waiters.Len() > 0 {
			next.ringEl = p.ring.PushBack(next) // its next waiter goes after every other source's
		}
		p.takeLocked(next)
		close(w.granted)
	}
}

// forgetLocked drops a source that neither holds nor waits for a slot.
func (p *slotPool) forgetLocked(s *slotSrc) {
	if s.held == 0 && s.waiters.Len() == 0 && p.sources[s.key] == s {
		delete(p.sources, s.key)
	}
}

// stats reports the slots held and the sources tracked (tests read them).
func (p *slotPool) stats() (held, sources int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held, len(p.sources)
}

// sourceOf is a caller's source address: its TCP peer's IP without the port, an IPv4-mapped IPv6
// address as the IPv4 one. Headers such as X-Forwarded-For are never read: any caller can write
// them.
func sourceOf(remoteAddr string) string {
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		return ap.Addr().Unmap().WithZone("").String()
	}
	if host, _, err := net.SplitHostPort(remoteAddr); err == nil {
		return host
	}
	return remoteAddr
}
