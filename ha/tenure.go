package ha

import (
	"context"
	"sync/atomic"
	"time"
)

// The tenure: how long this relay may still act as the leader. The Lease expires for the other
// relays a lease duration after they saw its last renewal, which they cannot have seen before it
// was sent; so a relay whose tenure ends a renew deadline after its last successful renewal was
// *sent* — not answered — stops acting before any other relay can take the Lease, whatever the
// API's latency and however late the answer. It is measured on the monotonic clock (an offset
// from a reading taken at construction), never against the wall clock or a time the API server
// wrote, so that a process stopped and resumed (SIGSTOP, a long pause, a frozen VM) finds its
// tenure over the moment it looks. The term is the tenure's outer bound: the tenure is held only
// while a term runs, and ends with it.
type tenure struct {
	now      func() time.Time // set at construction: the clock (Config.Now)
	base     time.Time        // set at construction: the reading offsets are taken from
	deadline time.Duration    // set at construction: the renew deadline
	until    atomic.Int64     // offset from base at which the tenure ends (nanoseconds); 0: none yet
	term     atomic.Bool      // a term runs: elected, and not yet fenced
}

func newTenure(now func() time.Time, renewDeadline time.Duration) *tenure {
	return &tenure{now: now, base: now(), deadline: renewDeadline}
}

// offset is the clock's reading as an offset from base. With time.Now both readings carry the
// monotonic clock, which Sub uses.
func (t *tenure) offset() time.Duration { return t.now().Sub(t.base) }

// sending is called right before a write of the Lease naming this relay is sent; it returns the
// instant, for renewed.
func (t *tenure) sending() time.Duration { return t.offset() }

// renewed: the write sent at sent succeeded. The tenure runs to sent + the renew deadline, and an
// older write answered after a newer one never shortens it.
func (t *tenure) renewed(sent time.Duration) {
	end := int64(sent + t.deadline)
	for {
		cur := t.until.Load()
		if end <= cur || t.until.CompareAndSwap(cur, end) {
			return
		}
	}
}

// begin starts a term; end ends it, and the tenure with it, for good.
func (t *tenure) begin() { t.term.Store(true) }
func (t *tenure) end()   { t.term.Store(false) }

// left is how long the tenure still runs: zero or less once it has ended, or while no term runs.
func (t *tenure) left() time.Duration {
	if !t.term.Load() {
		return 0
	}
	return time.Duration(t.until.Load()) - t.offset()
}

// held reports whether the relay may act as the leader at this instant: an atomic load or two and
// a clock reading.
func (t *tenure) held() bool { return t.left() > 0 }

// watch calls fence once the tenure has run out, unless ctx ends first. It sleeps until the
// tenure's end as known when it looks, and looks again then: renewals move the end forward.
func (t *tenure) watch(ctx context.Context, fence func()) {
	for {
		left := t.left()
		if left <= 0 {
			fence()
			return
		}
		timer := time.NewTimer(left)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}
