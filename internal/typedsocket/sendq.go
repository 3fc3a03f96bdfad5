package typedsocket

import "sync"

// Share charges the bytes a connection holds on behalf of a downstream peer (docs/hostile.md);
// *budget.Share implements it. A frame queued with a share is released from it exactly once: when
// it has been written, or when it is dropped because the connection ended.
type Share interface {
	Charge(n int) bool // take n bytes if they fit; false: nothing taken
	// ChargeWait takes n bytes, waiting for room until either channel is closed (false: nothing
	// taken). It blocks its caller.
	ChargeWait(n int, done1, done2 <-chan struct{}) bool
	// ChargeIncoming takes n bytes of a message being received, past the cap, waiting for room
	// in the pool until done is closed (false: nothing taken).
	ChargeIncoming(n int, done <-chan struct{}) bool
	Refusal(n int) // take n bytes of the relay's own refusal (at most maxRefusal) whatever the caps
	Release(n int)
	Limit() int64 // the cap
}

// sendQueue holds encoded frames for the send loop. Requests are bounded by frame count and
// bytes; a request that does not fit is refused at once (ErrQueueFull) instead of waiting, so a
// peer that stops reading never blocks the goroutine that called it. Answers are never refused:
// a peer request counts as in flight until its answer is written, so their number is bounded by
// the inflight limit, and dropping one would lose the peer's request.
type sendQueue struct {
	mu       sync.Mutex
	frames   []frame // guarded by mu
	bytes    int     // guarded by mu
	answers  int     // guarded by mu: bytes of the queued answers
	closed   bool    // guarded by mu
	maxCount int     // set at construction
	maxBytes int     // set at construction

	wake chan struct{} // capacity 1: the send loop has work
}

// frame is one encoded message; answer marks the answer to a peer's request; charge, when set,
// holds len(b) bytes until the frame is written or dropped.
type frame struct {
	b      []byte
	answer bool
	charge Share
}

// done releases what the frame held.
func (f *frame) done() {
	if f.charge != nil {
		f.charge.Release(len(f.b))
		f.charge = nil
	}
}

func (q *sendQueue) init(maxCount, maxBytes int) {
	q.maxCount, q.maxBytes = maxCount, maxBytes
	q.wake = make(chan struct{}, 1)
}

// push queues f; a bounded frame that does not fit is refused with ErrQueueFull. The queue owns
// f's charge from here on: a refused frame's charge is released at once.
func (q *sendQueue) push(f frame, bounded bool) error {
	q.mu.Lock()
	var err error
	switch {
	case q.closed:
		err = ErrClosed
	// The first frame always fits, so one message up to the read limit can always be sent.
	case bounded && len(q.frames) > 0 && (len(q.frames) >= q.maxCount || q.bytes+len(f.b) > q.maxBytes):
		err = ErrQueueFull
	}
	if err != nil {
		q.mu.Unlock()
		f.done()
		return err
	}
	q.frames = append(q.frames, f)
	q.bytes += len(f.b)
	if f.answer {
		q.answers += len(f.b)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return nil
}

// take moves every queued frame to dst, in order. The caller releases each one (frame.done).
func (q *sendQueue) take(dst []frame) []frame {
	q.mu.Lock()
	dst = append(dst, q.frames...)
	clear(q.frames)
	q.frames = q.frames[:0]
	q.bytes, q.answers = 0, 0
	q.mu.Unlock()
	return dst
}

// queuedBytes is what every queued frame holds.
func (q *sendQueue) queuedBytes() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bytes
}

// answerBytes is what queued answers hold.
func (q *sendQueue) answerBytes() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.answers
}

func (q *sendQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.frames)
}

// close refuses every later frame and drops (releases) the queued ones. It returns the number of
// answers dropped.
func (q *sendQueue) close() int {
	q.mu.Lock()
	q.closed = true
	frames := q.frames
	q.frames, q.bytes, q.answers = nil, 0, 0
	q.mu.Unlock()
	answers := 0
	for i := range frames {
		if frames[i].answer {
			answers++
		}
		frames[i].done()
	}
	return answers
}
