package typedsocket

import "sync"

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

// frame is one encoded message; answer marks the answer to a peer's request.
type frame struct {
	b      []byte
	answer bool
}

func (q *sendQueue) init(maxCount, maxBytes int) {
	q.maxCount, q.maxBytes = maxCount, maxBytes
	q.wake = make(chan struct{}, 1)
}

func (q *sendQueue) push(b []byte, bounded bool) error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	// The first frame always fits, so one message up to the read limit can always be sent.
	if bounded && len(q.frames) > 0 && (len(q.frames) >= q.maxCount || q.bytes+len(b) > q.maxBytes) {
		q.mu.Unlock()
		return ErrQueueFull
	}
	q.frames = append(q.frames, frame{b: b, answer: !bounded})
	q.bytes += len(b)
	if !bounded {
		q.answers += len(b)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return nil
}

// take moves every queued frame to dst, in order.
func (q *sendQueue) take(dst []frame) []frame {
	q.mu.Lock()
	dst = append(dst, q.frames...)
	clear(q.frames)
	q.frames = q.frames[:0]
	q.bytes, q.answers = 0, 0
	q.mu.Unlock()
	return dst
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

func (q *sendQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.frames, q.bytes = nil, 0
	q.mu.Unlock()
}
