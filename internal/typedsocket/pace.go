package typedsocket

import (
	"errors"
	"fmt"
	"time"
)

// Pace bounds how long a peer may take to send one message. A message half sent holds the buffer
// charged for it; a peer that sends slowly, or stops, would keep that charge, and a share filled
// that way keeps everyone else out. Time the connection spent waiting for room in the budget is
// the relay's, not the peer's, and is not counted. A zero field is no bound.
type Pace struct {
	// First: the connection's first message arrives whole within First of its start (its header
	// read).
	First time.Duration
	// MinRate: every message arrives at MinRate bytes a second or faster, allowed at least First
	// (a second when First is zero) however small it is.
	MinRate int64
}

// ErrTooSlow ends a connection whose peer sent a message slower than its Pace allows.
var ErrTooSlow = errors.New("typedsocket: the peer sent a message slower than its pace allows")

// allowed is how long a message may have taken once received of its bytes have arrived, the
// connection's first message or not; 0: no bound.
func (p *Pace) allowed(first bool, received int) time.Duration {
	if first && p.First > 0 {
		return p.First
	}
	if p.MinRate <= 0 {
		return 0
	}
	grace := p.First
	if grace <= 0 {
		grace = time.Second
	}
	return max(grace, time.Duration(float64(received)/float64(p.MinRate)*float64(time.Second)))
}

// SetPace bounds the messages read from now on (nil: no bound); a connection that registers is
// trusted with its own share and paced no more. Safe from any goroutine.
func (c *Conn) SetPace(p *Pace) { c.pace.Store(p) }

// pacer holds one message's pace while it is read, on the read loop.
type pacer struct {
	c       *Conn
	p       *Pace // nil: not paced
	first   bool
	start   time.Time
	waited  time.Duration // spent waiting for room in the budget
	pausing time.Time     // when the current wait began
}

func (c *Conn) startPace() pacer {
	p := c.pace.Load()
	if p == nil {
		return pacer{}
	}
	return pacer{c: c, p: p, first: c.messages == 0, start: time.Now()}
}

// arm sets when the message must have arrived, received of its bytes in.
func (pc *pacer) arm(received int) {
	if pc.p == nil {
		return
	}
	d := pc.p.allowed(pc.first, received)
	if d <= 0 {
		return
	}
	due := pc.start.Add(pc.waited + d)
	pc.c.paceDue.Store(due.UnixNano())
	if pc.c.paceTimer == nil {
		pc.c.paceTimer = time.AfterFunc(time.Until(due), pc.c.paceExpired)
	} else {
		pc.c.paceTimer.Reset(time.Until(due))
	}
}

// pause stops the clock while the read waits for room in the budget; arm starts it again.
func (pc *pacer) pause() {
	if pc.p == nil {
		return
	}
	pc.c.paceDue.Store(0)
	pc.pausing = time.Now()
}

func (pc *pacer) resume() {
	if pc.p == nil {
		return
	}
	pc.waited += time.Since(pc.pausing)
}

// stop: the message is read, or its read failed.
func (pc *pacer) stop() {
	if pc.p == nil {
		return
	}
	pc.c.paceDue.Store(0)
	if pc.c.paceTimer != nil {
		pc.c.paceTimer.Stop()
	}
}

// paceExpired ends the connection when the message being read is overdue. A timer armed for an
// earlier due time finds a later one, or none, and does nothing.
func (c *Conn) paceExpired() {
	due := c.paceDue.Load()
	if due == 0 || time.Now().UnixNano() < due {
		return
	}
	// Cancelling closes the socket (Run), without a close handshake: the peer is not sending what
	// it started, and a close frame would wait behind it.
	c.cancel(fmt.Errorf("%w: %w", ErrClosed, ErrTooSlow))
}
