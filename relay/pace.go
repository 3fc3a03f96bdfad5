package relay

import (
	"container/list"
	"sync"
	"time"

	"code.foss.global/serve.zone/relay/internal/budget"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// Shares are taken in turn, not kept (docs/hostile.md): bounded memory must not let whoever fills
// the unregistered connections' part of the budget first keep it. Two rules free it again:
//   - Pace: an unregistered connection's first message arrives whole within FirstFrameTimeout of
//     its start, and every message at MinFrameRate or faster; else the connection is closed and
//     its charge released (typedsocket.Pace, reason "frame-slow").
//   - Turns: when a message being received does not fit the unregistered part, the connection
//     that has held a partial message longest is closed to admit it (reason "partial-oldest"),
//     as descriptors close the oldest unregistered connection.

// Defaults of the pace (--first-frame-timeout, --min-frame-rate).
const (
	DefaultFirstFrameTimeout = 2 * time.Second
	DefaultMinFrameRate      = 32 << 10 // bytes a second
)

// paceOf is the pace cfg sets for unregistered connections.
func paceOf(cfg Config) typedsocket.Pace {
	return typedsocket.Pace{First: cfg.FirstFrameTimeout, MinRate: cfg.MinFrameRate}
}

// partials orders the messages unregistered connections are receiving by when each began, oldest
// first: the one to close when another does not fit.
type partials struct {
	part *budget.Share  // set at construction: the unregistered connections' partition
	b    *budget.Budget // set at construction

	mu        sync.Mutex
	held      list.List // guarded by mu: *partial that hold a charge, oldest first
	releasing int64     // guarded by mu: what partials closed to make room still hold
}

// partial is one unregistered connection's incoming charge: the typedsocket.Share its messages are
// read into, the partition's with the connection's place in line.
type partial struct {
	ps    *partials // set at construction
	evict func()    // set at construction: closes the connection at once, never blocking

	held    int64         // guarded by ps.mu: bytes charged for the message being received
	elem    *list.Element // guarded by ps.mu: its place in ps.held; nil while it holds nothing or once evicted
	evicted bool          // guarded by ps.mu: closed to make room; what it holds is on its way back
}

func newPartials(b *budget.Budget, part *budget.Share) *partials {
	return &partials{b: b, part: part}
}

// holder is the incoming share of one unregistered connection; evict closes it without blocking.
func (ps *partials) holder(evict func()) *partial { return &partial{ps: ps, evict: evict} }

// ChargeIncoming charges n bytes of the message being received to the partition, closing the
// connection that has held a partial message longest while they do not fit, and waits for the
// room that frees until done is closed.
func (h *partial) ChargeIncoming(n int, done <-chan struct{}) bool {
	ps := h.ps
	try := func() bool {
		if ps.part.Charge(n) {
			h.took(int64(n))
			return true
		}
		ps.makeRoom(h, int64(n))
		return false
	}
	return ps.b.WaitFor(try, done, nil)
}

// makeRoom closes the oldest partial message's connection but self's, unless what closed ones
// still hold is enough for need already. It reports whether it closed one.
func (ps *partials) makeRoom(self *partial, need int64) bool {
	ps.mu.Lock()
	if ps.releasing >= need {
		ps.mu.Unlock()
		return false
	}
	var victim *partial
	for e := ps.held.Front(); e != nil; e = e.Next() {
		if v := e.Value.(*partial); v != self {
			victim = v
			break
		}
	}
	if victim == nil {
		ps.mu.Unlock()
		return false
	}
	ps.held.Remove(victim.elem)
	victim.elem = nil
	victim.evicted = true
	ps.releasing += victim.held
	ps.mu.Unlock()
	victim.evict()
	return true
}

func (h *partial) took(n int64) {
	ps := h.ps
	ps.mu.Lock()
	h.held += n
	if h.evicted {
		ps.releasing += n // on its way back with the rest
	} else if h.elem == nil {
		h.elem = ps.held.PushBack(h)
	}
	ps.mu.Unlock()
}

// Release gives back n bytes of a message read whole, or dropped.
func (h *partial) Release(n int) {
	ps := h.ps
	ps.mu.Lock()
	m := min(int64(n), h.held)
	h.held -= m
	if h.evicted {
		ps.releasing -= m
	}
	if h.held == 0 && h.elem != nil {
		ps.held.Remove(h.elem)
		h.elem = nil
	}
	ps.mu.Unlock()
	ps.part.Release(n)
}

// The rest of typedsocket.Share is the partition's: only a message being received is charged here.
func (h *partial) Charge(n int) bool { return h.ps.part.Charge(n) }
func (h *partial) ChargeWait(n int, done1, done2 <-chan struct{}) bool {
	return h.ps.part.ChargeWait(n, done1, done2)
}
func (h *partial) Refusal(n int) { h.ps.part.Refusal(n) }
func (h *partial) Limit() int64  { return h.ps.part.Limit() }

var _ typedsocket.Share = (*partial)(nil)
