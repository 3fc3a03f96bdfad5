package client

import "sync"

// inbox holds datagrams from the hub between the drain loop, which pushes them as quic-go hands
// them over, and the receive methods, which pop them in bursts. When it is full the newest
// datagram is dropped: the receiver is behind, and the oldest are closest to being read.
type inbox struct {
	ready chan struct{} // capacity 1: signalled after a push into an empty inbox
	done  chan struct{} // closed when the drain loop ends

	mu   sync.Mutex
	ring [][]byte // guarded by mu; len(ring) is the capacity
	head int      // guarded by mu: index of the oldest datagram
	n    int      // guarded by mu: datagrams held
}

func newInbox(capacity int) *inbox {
	return &inbox{ready: make(chan struct{}, 1), done: make(chan struct{}), ring: make([][]byte, capacity)}
}

// push adds d; it reports false, keeping nothing, when the inbox is full.
func (q *inbox) push(d []byte) bool {
	q.mu.Lock()
	if q.n == len(q.ring) {
		q.mu.Unlock()
		return false
	}
	q.ring[(q.head+q.n)%len(q.ring)] = d
	q.n++
	first := q.n == 1
	q.mu.Unlock()
	if first {
		select {
		case q.ready <- struct{}{}:
		default:
		}
	}
	return true
}

// pop returns the oldest datagram, or nil when the inbox is empty.
func (q *inbox) pop() []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		return nil
	}
	d := q.ring[q.head]
	q.ring[q.head] = nil
	q.head = (q.head + 1) % len(q.ring)
	q.n--
	return d
}

// popAll appends every held datagram to dst, oldest first, up to cap(dst): one lock for a burst.
func (q *inbox) popAll(dst [][]byte) [][]byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	for ; q.n > 0 && len(dst) < cap(dst); q.n-- {
		dst = append(dst, q.ring[q.head])
		q.ring[q.head] = nil
		q.head = (q.head + 1) % len(q.ring)
	}
	return dst
}

// close tells the receivers that nothing more will come.
func (q *inbox) close() { close(q.done) }
