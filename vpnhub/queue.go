package vpnhub

import "sync"

// packetQueue is a member's bounded send queue (docs/protocol.md#vpn-hub: sending to a member never blocks the
// hub). Any number of forward loops push; the member's one send loop pops. When the queue is full
// a push drops the oldest packet, so a slow member loses its stalest traffic and nobody waits.
type packetQueue struct {
	ready chan struct{} // capacity 1: signalled after a push into an empty queue

	mu   sync.Mutex
	ring [][]byte // guarded by mu; len(ring) is the capacity
	head int      // guarded by mu: index of the oldest packet
	n    int      // guarded by mu: packets queued
}

func newPacketQueue(capacity int) *packetQueue {
	return &packetQueue{ready: make(chan struct{}, 1), ring: make([][]byte, capacity)}
}

// push queues p, which the queue now owns. It reports whether the oldest packet was dropped to
// make room.
func (q *packetQueue) push(p []byte) (dropped bool) {
	q.mu.Lock()
	if q.n == len(q.ring) {
		q.ring[q.head] = nil
		q.head = (q.head + 1) % len(q.ring)
		q.n--
		dropped = true
	}
	q.ring[(q.head+q.n)%len(q.ring)] = p
	q.n++
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return dropped
}

// popAll appends every queued packet to dst, oldest first, and empties the queue: one lock for a
// whole burst.
func (q *packetQueue) popAll(dst [][]byte) [][]byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	for ; q.n > 0; q.n-- {
		dst = append(dst, q.ring[q.head])
		q.ring[q.head] = nil
		q.head = (q.head + 1) % len(q.ring)
	}
	return dst
}

// len reports the packets queued.
func (q *packetQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}
