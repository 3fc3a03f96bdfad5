package escrow

import (
	"container/heap"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// Release retry policy (project-defined, docs/decisions.md "Escrow"): a push that is refused or
// fails is retried for the same renewal after 1 s, 2 s, 4 s, … at most 60 s apart, at most
// maxAttempts times while its window is current; the next renewal's slot is always pushed when
// it opens, whatever happened to the one before.
const (
	retryFirst  = int64(time.Second / time.Millisecond)
	retryMax    = int64(time.Minute / time.Millisecond)
	maxAttempts = 8
)

// Why a run stopped being held, for metrics and logs.
const (
	dropExpired = "expired"         // its last window ended
	dropCleared = "cleared"         // an empty run replaced it
	dropCustody = "custody-ended"   // Cloudly said it does not dispatch to this relay
	dropForeign = "foreign-session" // the node re-registered under another scope
)

// scheduler decides which renewal to push to which node and when. It does no I/O and reads no
// clock: every input carries now (Unix ms), and pushes come back as release values for the
// caller to send. It is not safe for concurrent use; Escrow guards it with its mutex.
//
// One heap orders the nodes holding a run by the time their state next changes — a slot
// opening, a retry coming due, the run's last window ending — so the caller needs one timer for
// any number of nodes.
type scheduler struct {
	attached bool
	standby  bool // the relay is an HA standby (or fenced): it releases nothing
	nodes    map[string]*nodeState
	due      dueHeap
	renewals int // renewals held across all runs
	dropped  func(node string, run *heldRun, why string)
}

// nodeState is what the scheduler knows of one node: its carrier, its run, and how far release
// has come in the current session. A node with neither carrier nor run has no state.
type nodeState struct {
	id string

	// The carrier: the connection the node's current session is bound to. node is nil while the
	// relay carries no session of the node.
	node       feature.Node
	conn       uint64
	session    []byte // the session binding, raw; the apply request carries it untouched
	controller []byte // canonical JSON of the session's controller
	namespace  string
	epoch      uint64 // changes with every binding and loss, so late answers are recognised

	run      *heldRun
	acked    int64 // highest sequence the node acknowledged for this projection, over every session; -1 none
	tried    int   // index of the renewal attempts counts; -1 none
	attempts int
	retryAt  int64
	inflight bool  // one push per node at a time
	since    int64 // when the node last became due for release (detach, binding, hold)

	at   int64 // heap key: when to look at the node next
	hidx int   // index in the heap; -1 when not in it
}

// release is one push to send: applyRuntimeNetworkDnsLeaseRenewal { session, signed } on node.
type release struct {
	nodeID  string
	node    feature.Node
	epoch   uint64
	session []byte
	run     *heldRun
	idx     int
	dueAt   int64 // when it became due: the slot opening, or the detach, binding or hold after it
	attempt int   // 1 for the first push of this renewal in this session
}

func newScheduler(dropped func(node string, run *heldRun, why string)) *scheduler {
	if dropped == nil {
		dropped = func(string, *heldRun, string) {}
	}
	return &scheduler{nodes: make(map[string]*nodeState), dropped: dropped}
}

func (s *scheduler) state(id string) *nodeState {
	ns := s.nodes[id]
	if ns == nil {
		ns = &nodeState{id: id, acked: -1, tried: -1, hidx: -1}
		s.nodes[id] = ns
	}
	return ns
}

// runs is the number of held runs.
func (s *scheduler) runs() int { return len(s.due) }

// carrier returns the node's current session, if the relay carries one.
func (s *scheduler) carrier(id string) (*nodeState, bool) {
	ns := s.nodes[id]
	return ns, ns != nil && ns.node != nil
}

// hold makes run the node's run, replacing what was held.
func (s *scheduler) hold(id string, run *heldRun, now int64) {
	ns := s.state(id)
	if old := ns.run; old != nil {
		s.renewals -= len(old.renewals)
		if old.projection != run.projection {
			// Sequences count per projection: a successor projection starts its own.
			ns.acked = -1
		}
	}
	ns.run = run
	s.renewals += len(run.renewals)
	ns.tried, ns.attempts, ns.retryAt, ns.since = -1, 0, 0, now
	s.reschedule(ns, now)
}

// clear drops the node's run, if any.
func (s *scheduler) clear(id string) {
	if ns := s.nodes[id]; ns != nil {
		s.drop(ns, dropCleared)
	}
}

// setAttached records the upstream state. Release happens only while detached; a new detach
// starts every node afresh, due at once if a window is current.
func (s *scheduler) setAttached(attached bool, now int64) {
	if s.attached == attached {
		return
	}
	s.attached = attached
	for _, ns := range s.nodes {
		if ns.run == nil {
			continue
		}
		if !attached {
			ns.tried, ns.attempts, ns.retryAt, ns.since = -1, 0, 0, now
		}
		s.reschedule(ns, now)
	}
}

// setStandby records whether the relay stands by: an HA standby, or a leader that lost its
// Lease, releases nothing whatever the upstream does; leading again starts every node afresh.
func (s *scheduler) setStandby(standby bool, now int64) {
	if s.standby == standby {
		return
	}
	s.standby = standby
	for _, ns := range s.nodes {
		if ns.run == nil {
			continue
		}
		if !standby {
			ns.tried, ns.attempts, ns.retryAt, ns.since = -1, 0, 0, now
		}
		s.reschedule(ns, now)
	}
}

// endCustody drops every run.
func (s *scheduler) endCustody() {
	for _, ns := range s.nodes {
		s.drop(ns, dropCustody)
	}
}

// bound records that the node's session is now bound to node on connection conn. A new binding
// (another connection, or another session on the same one) starts release afresh — the current
// renewal is pushed again unless the node already acknowledged it — but what the node
// acknowledged is kept: a renewal is never pushed to a node that acknowledged it, whichever
// connection or relay it came through. A run whose scope is not the new session's is dropped,
// with what was acknowledged of it; bound reports that.
func (s *scheduler) bound(id string, node feature.Node, conn uint64, session, controller []byte, namespace string, now int64) (dropped bool) {
	ns := s.state(id)
	if ns.node != nil && ns.conn == conn && string(ns.session) == string(session) {
		return false // the same binding again: nothing new
	}
	ns.node, ns.conn, ns.session, ns.controller, ns.namespace = node, conn, session, controller, namespace
	ns.epoch++
	ns.tried, ns.attempts, ns.retryAt, ns.inflight, ns.since = -1, 0, 0, false, now
	if ns.run != nil && !ns.run.inScope(controller, namespace) {
		ns.acked = -1
		s.drop(ns, dropForeign)
		return true
	}
	s.reschedule(ns, now)
	return false
}

// gone records that connection conn, which carried the node, has ended. The run stays: the node
// may come back before its last window ends.
func (s *scheduler) gone(id string, conn uint64, now int64) {
	ns := s.nodes[id]
	if ns == nil || ns.node == nil || ns.conn != conn {
		return
	}
	ns.node, ns.session, ns.controller, ns.namespace = nil, nil, nil, ""
	ns.epoch++
	ns.inflight = false
	if ns.run == nil {
		delete(s.nodes, id)
		return
	}
	s.reschedule(ns, now)
}

// next is when the scheduler next has something to do, if ever.
func (s *scheduler) next() (int64, bool) {
	if len(s.due) == 0 {
		return 0, false
	}
	return s.due[0].at, true
}

// releases returns the pushes due at now, at most limit of them (limit <= 0: all), and drops
// the runs whose last window has ended on the way. A caller that got limit pushes calls again.
func (s *scheduler) releases(now int64, limit int) []release {
	var out []release
	if limit > 0 {
		out = make([]release, 0, min(limit, len(s.due)))
	}
	for len(s.due) > 0 && s.due[0].at <= now && (limit <= 0 || len(out) < limit) {
		ns := s.due[0]
		if now >= ns.run.lastExpires() {
			s.drop(ns, dropExpired)
			continue
		}
		if i := s.wanted(ns, now); i >= 0 {
			if ns.tried != i {
				ns.tried, ns.attempts = i, 0
			}
			ns.attempts++
			ns.inflight = true
			dueAt := max(ns.run.renewals[i].notBefore, ns.since)
			if ns.attempts > 1 {
				dueAt = ns.retryAt
			}
			out = append(out, release{nodeID: ns.id, node: ns.node, epoch: ns.epoch, session: ns.session,
				run: ns.run, idx: i, dueAt: dueAt, attempt: ns.attempts})
		}
		s.reschedule(ns, now)
	}
	return out
}

// wanted is the index of the renewal to push to the node now, or -1.
func (s *scheduler) wanted(ns *nodeState, now int64) int {
	if s.attached || s.standby || ns.node == nil || ns.inflight {
		return -1
	}
	i := ns.run.current(now)
	if i < 0 || ns.run.renewals[i].sequence <= ns.acked {
		return -1
	}
	if ns.tried == i && ns.attempts > 0 && (ns.attempts >= maxAttempts || now < ns.retryAt) {
		return -1
	}
	return i
}

// result records the node's answer to a push: ok when it bound to the renewal sent (accepted or
// replay), else a refusal or failure to retry. It reports whether the node's acknowledged
// sequence rose.
func (s *scheduler) result(r release, ok bool, now int64) (acked bool) {
	ns := s.nodes[r.nodeID]
	if ns == nil || ns.epoch != r.epoch {
		return false // the session it was sent under is gone
	}
	ns.inflight = false
	if ns.run == nil {
		return false
	}
	switch {
	case ok && r.run.projection == ns.run.projection:
		if seq := r.run.renewals[r.idx].sequence; seq > ns.acked {
			ns.acked, acked = seq, true
		}
	case !ok && r.run == ns.run && ns.tried == r.idx:
		ns.retryAt = now + min(retryFirst<<(ns.attempts-1), retryMax)
	}
	s.reschedule(ns, now)
	return acked
}

// acknowledged records, on a standby, how far the leader's node acknowledged the run it holds
// under projection: nothing up to seq is pushed to it again.
func (s *scheduler) acknowledged(id string, projection contracts.ProjectionReference, seq, now int64) {
	ns := s.nodes[id]
	if ns == nil || ns.run == nil || ns.run.projection != projection {
		return
	}
	ns.acked = seq
	s.reschedule(ns, now)
}

// drop stops holding the node's run.
func (s *scheduler) drop(ns *nodeState, why string) {
	if ns.run == nil {
		return
	}
	run := ns.run
	s.renewals -= len(run.renewals)
	ns.run = nil
	ns.tried, ns.attempts, ns.retryAt = -1, 0, 0
	if ns.hidx >= 0 {
		heap.Remove(&s.due, ns.hidx)
	}
	if ns.node == nil {
		delete(s.nodes, ns.id)
	}
	s.dropped(ns.id, run, why)
}

// reschedule puts the node in the heap at the next time its state can change.
func (s *scheduler) reschedule(ns *nodeState, now int64) {
	if ns.run == nil {
		return
	}
	ns.at = s.nextAt(ns, now)
	if ns.hidx < 0 {
		heap.Push(&s.due, ns)
	} else {
		heap.Fix(&s.due, ns.hidx)
	}
}

// nextAt is the earliest of: now, if a push is wanted; the retry, if one is pending; the next
// slot opening; the run's last window ending.
func (s *scheduler) nextAt(ns *nodeState, now int64) int64 {
	run := ns.run
	at := run.lastExpires()
	if s.attached || s.standby || ns.node == nil || ns.inflight {
		return at
	}
	if i := run.current(now); i >= 0 && run.renewals[i].sequence > ns.acked {
		switch {
		case ns.tried != i || ns.attempts == 0:
			return now
		case ns.attempts < maxAttempts:
			at = min(at, max(ns.retryAt, now))
		}
	}
	if j := run.nextSlot(now); j < len(run.renewals) {
		at = min(at, run.renewals[j].notBefore)
	}
	return at
}

// dueHeap is a min-heap of nodes by at.
type dueHeap []*nodeState

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx, h[j].hidx = i, j
}
func (h *dueHeap) Push(x any) {
	ns := x.(*nodeState)
	ns.hidx = len(*h)
	*h = append(*h, ns)
}
func (h *dueHeap) Pop() any {
	old := *h
	ns := old[len(old)-1]
	old[len(old)-1] = nil
	ns.hidx = -1
	*h = old[:len(old)-1]
	return ns
}
