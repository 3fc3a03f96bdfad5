package sim

import (
	"fmt"
	"maps"

	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// Several relays of one cluster: what Cloudly can judge of who acts for the cluster. Cloudly
// takes the newest accepted registration's socket as the cluster's; an older socket whose
// registration was accepted is superseded from that moment, and its relay must act for the
// cluster no more: a request or stream frame that arrives on it afterwards is a late act, a
// violation. A registration accepted while an older accepted socket is still open is two relays
// attached at once — unless the test has stopped the older socket's relay process (SIGSTOP):
// its kernel keeps the socket open, and what that relay does once resumed is judged as a late
// act instead.

// haJudge is the stand-in's record of who registered on which socket. Guarded by Cloudly.mu.
type haJudge struct {
	node       map[*typedsocket.Conn]string // the relay node each accepted socket registered as
	superseded map[*typedsocket.Conn]string // accepted sockets another relay's registration superseded: by which node
	late       map[string]int               // by relay node: requests and stream frames received on a superseded socket
	stopped    map[string]bool              // relay nodes whose process the test has stopped
	overlaps   int64                        // registrations accepted while a stopped relay's accepted socket was open
	registered newest[string]               // the relay node of every accepted registration, in order
}

func (j *haJudge) init() {
	if j.node == nil {
		j.node, j.superseded, j.late, j.stopped = map[*typedsocket.Conn]string{}, map[*typedsocket.Conn]string{}, map[string]int{}, map[string]bool{}
	}
}

// acceptedLocked records conn's accepted registration as relay node, and supersedes every other
// accepted socket still open.
func (c *Cloudly) acceptedLocked(conn *typedsocket.Conn, node string) {
	c.ha.init()
	c.ha.node[conn] = node
	c.ha.registered.add(node)
	delete(c.ha.superseded, conn)
	for other := range c.attachedAll {
		if other != conn && other.Context().Err() == nil {
			c.ha.superseded[other] = node
		}
	}
}

// overlapStoppedLocked reports whether other, an accepted socket still open while conn's
// registration is accepted, belongs to a relay the test has stopped; it counts the overlap.
func (c *Cloudly) overlapStoppedLocked(other *typedsocket.Conn) bool {
	c.ha.init()
	if !c.ha.stopped[c.ha.node[other]] {
		return false
	}
	c.ha.overlaps++
	return true
}

// stoppedLocked reports whether conn's relay process is stopped by the test.
func (c *Cloudly) stoppedLocked(conn *typedsocket.Conn) bool {
	return c.ha.stopped[c.ha.node[conn]]
}

// actedLocked judges a request or stream frame conn carried: on a superseded socket it is a late
// act, counted for its relay and recorded as a violation.
func (c *Cloudly) actedLocked(conn *typedsocket.Conn, what string) {
	by, ok := c.ha.superseded[conn]
	if !ok {
		return
	}
	node := c.ha.node[conn]
	c.ha.late[node]++
	c.violations = firstFew(c.violations, fmt.Sprintf("relay %s sent %s on its socket after relay %s attached", node, what, by))
}

// forgetLocked drops what was recorded of a closed socket.
func (c *Cloudly) forgetLocked(conn *typedsocket.Conn) {
	if c.ha.node != nil {
		delete(c.ha.node, conn)
		delete(c.ha.superseded, conn)
	}
}

// SetRelayStopped tells Cloudly that the process of relay node (its registration's relay.nodeId)
// is stopped (SIGSTOP) from now until SetRelayStopped(node, false). A registration accepted while
// that relay's accepted socket is still open is then not counted as two relays attached
// (OverlapsWithStopped counts it): the stopped process can close nothing. Whatever it sends on
// that socket once resumed is a late act (LateActs).
func (c *Cloudly) SetRelayStopped(node string, stopped bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ha.init()
	c.ha.stopped[node] = stopped
}

// OverlapsWithStopped is how many registrations Cloudly accepted while a stopped relay's
// accepted socket was still open.
func (c *Cloudly) OverlapsWithStopped() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ha.overlaps
}

// LateActs is, by relay node, how many requests and stream frames Cloudly received on a socket
// after another relay's registration had been accepted (each also listed in Violations); the goal
// is none.
func (c *Cloudly) LateActs() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.ha.late)
}

// RegisteredRelays is the relay node (relay.nodeId) of every registration Cloudly accepted, in
// order: the newest 64. A change from one entry to the next is a change of leader.
func (c *Cloudly) RegisteredRelays() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ha.registered.all()
}
