package platform

import (
	"context"
	"sync"
)

// Closure slots, shared fairly between Corestores. A node holds at most perNode closures at once,
// and the cluster at most cluster; but the cluster-wide count never keeps out a node that has no
// closure running: its first closure is always admitted at once (what it holds stays inside the
// relay's peer memory budget, which is the real bound), and the count applies to second and later
// closures. So Corestores that accept a closure and then stand still hold one slot each and
// cannot keep a healthy Corestore waiting. A closure that cannot be admitted waits; when a slot
// frees, the waiting closure whose node has the fewest running goes first (the longest waiting
// among equals). No closure is ever ended to make room: a stalled one ends only by its own
// no-byte bound.
type slots struct {
	perNode int // set at construction
	cluster int // set at construction

	mu      sync.Mutex
	running map[string]int // guarded by mu: closures running per node; absent for none
	total   int            // guarded by mu: closures running across nodes
	waiting []*slotWaiter  // guarded by mu: closures waiting, in arrival order
}

// slotWaiter is one closure waiting for a slot; granted is closed once it holds one.
type slotWaiter struct {
	node    string
	granted chan struct{}
	held    bool // guarded by the slots' mu: the slot was given to it
}

func newSlots(perNode, cluster int) *slots {
	return &slots{perNode: perNode, cluster: cluster, running: make(map[string]int)}
}

// admissibleLocked: node may start a closure now.
func (s *slots) admissibleLocked(node string) bool {
	r := s.running[node]
	return r < s.perNode && (r == 0 || s.total < s.cluster)
}

func (s *slots) takeLocked(node string) {
	s.running[node]++
	s.total++
}

// acquire takes a slot for one of node's closures, waiting until one is admitted or ctx ends; it
// reports whether it holds one (then release gives it back).
func (s *slots) acquire(ctx context.Context, node string) bool {
	s.mu.Lock()
	if s.admissibleLocked(node) {
		s.takeLocked(node)
		s.mu.Unlock()
		return true
	}
	w := &slotWaiter{node: node, granted: make(chan struct{})}
	s.waiting = append(s.waiting, w)
	s.mu.Unlock()
	select {
	case <-w.granted:
		return true
	case <-ctx.Done():
	}
	s.mu.Lock()
	held := w.held
	if !held {
		for i, x := range s.waiting {
			if x == w {
				s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
				break
			}
		}
	}
	s.mu.Unlock()
	if held { // granted as ctx ended: given back, to the next in line
		s.release(node)
	}
	return false
}

// release gives back one of node's slots and admits the waiting closures that may run now,
// fewest running first.
func (s *slots) release(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[node]--; s.running[node] <= 0 {
		delete(s.running, node)
	}
	s.total--
	for {
		best := -1
		for i, w := range s.waiting {
			if s.admissibleLocked(w.node) && (best < 0 || s.running[w.node] < s.running[s.waiting[best].node]) {
				best = i
			}
		}
		if best < 0 {
			return
		}
		w := s.waiting[best]
		s.waiting = append(s.waiting[:best], s.waiting[best+1:]...)
		s.takeLocked(w.node)
		w.held = true
		close(w.granted)
	}
}

// inflight is the closures running across nodes.
func (s *slots) inflight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}
