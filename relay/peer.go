package relay

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"golang.org/x/time/rate"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/budget"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// Downstream connection limits. A node's queue is small on purpose: a node that stops reading
// gets relay-node-busy answers instead of holding the relay's memory. Its bytes are bounded by
// the peer's share (RegisteredShare).
const (
	nodeMaxQueue    = 256
	nodeMaxInflight = 256
)

// Shares of the peer memory budget (docs/hostile.md): what the relay may hold for one downstream
// connection — the message it is receiving, answers queued to it, requests and stream frames
// queued to it or sent for it to Cloudly — until written. An unregistered connection's share is
// its queued answers; the message it is sending is charged with every unregistered connection's
// own cost (downstream.unregistered), and its registrations at Cloudly to the anonymous pool.
// Shares are caps, not reservations: the pool, not the sum of the caps, bounds what all hold.
const (
	DefaultPeerMemoryBytes = 256 << 20
	AnonymousShare         = 16 << 10
	RegisteredShare        = 32 << 20
)

// Downstream connections that have not registered (no accepted node or ingress registration,
// docs/hostile.md): at most MaxUnregistered at once and DefaultMaxUnregisteredPerSource from one source
// address, beyond which an upgrade is answered 503 with Retry-After; each is closed (1008)
// RegisterDeadline after its upgrade, never extended, and may send MaxRegistrationsPerConnection
// registrations in that time, one at a time. What else it sends (it may send only
// registrations) is refused by name at most RefusedUnregisteredRate times a second,
// RefusedUnregisteredBurst at once; one that sends faster is closed unanswered (judge). Every WebSocket peer of the relay registers first, so only an anonymous client is
// affected; the bounds are above a reconnect storm of 10 000 nodes.
const (
	MaxUnregistered                 = 16384
	DefaultMaxUnregisteredPerSource = 64
	RegisterDeadline                = 60 * time.Second
	MaxRegistrationsPerConnection   = 8
	RefusedUnregisteredRate         = 1.0
	RefusedUnregisteredBurst        = 2
)

// unregisteredCost is what one unregistered connection costs the relay before it holds anything
// for its peer: the WebSocket's buffers kept from the HTTP server (9.4 KiB), the connection's own
// state (5 KiB) and its two goroutines' stacks (8 KiB), measured with 4 000 idle connections. It is
// charged to the peer memory budget from the upgrade until the connection registers or ends, so
// that anonymous connections cannot hold more memory than the budget (the hostile-load
// fault: 16 384 of them held 220 MiB live outside every charge). Their costs together may take at
// most half the budget (unregisteredPart), so that registered peers always keep the other half:
// an anonymous flood fills its half and is refused 503, never costing a node its place.
const (
	unregisteredCost = 24 << 10
	unregisteredPart = 2 // the budget's 1/unregisteredPart
)

// The anonymous pool (docs/hostile.md): registrations of connections that have not registered, at
// Cloudly at once — their count and their bodies' bytes, held until Cloudly answers.
const (
	MaxAnonymousRegistrations  = 1024
	AnonymousRegistrationBytes = 16 << 20
)

// evictionStall is how long a write to a connection must have moved not one frame for the
// connection to count as reading nothing, and be evicted, when the peer memory budget is spent. A
// peer that never reads is stalled for good, so the window costs only how long the budget stays
// spent before it goes (charges wait or are refused by name meanwhile); an honest node that reads
// slowly, or whose process — or this one — is not scheduled for a while, pauses well inside it.
// The window was 100 ms: beside two CPU hogs under the race detector the relay, at 0.04 cores,
// evicted 19 of 20 honest nodes that way (docs/hostile.md "Honest nodes on a starved machine").
// Five seconds is fifty times that, five times the second after which a ping from a peer whose
// writes have not moved goes unanswered (typedsocket's pongStall), and well inside the 45 s a
// blocked write may last before the connection is dropped as dead.
const evictionStall = 5 * time.Second

// waiting is what the budget's eviction asks of a connection (budget.Waiting): the bytes queued to
// it, and whether its peer reads nothing — a write to it has not moved for evictionStall.
func waiting(c *typedsocket.Conn) (int64, bool) {
	return int64(c.QueuedBytes()), c.Stalled(evictionStall)
}

// retryAfterSeconds is the Retry-After of a refused upgrade.
const retryAfterSeconds = "5"

// closeSuperseded is the WebSocket close status of a connection whose node registered again on
// another connection (project-defined, in the application range).
const closeSuperseded websocket.StatusCode = 4001

// closeStandingDown is the close status of every downstream connection of a relay that stands by
// again (project-defined): its node reconnects, through the Service, to the elected relay.
const closeStandingDown = websocket.StatusGoingAway

type role uint8

const (
	roleNone role = iota
	roleNode
	roleIngress
)

// peer is one downstream WebSocket connection.
type peer struct {
	id     uint64            // set at construction
	conn   *typedsocket.Conn // set at construction
	raw    net.Conn          // set at construction: the socket under it, closed when a close overruns
	adm    *admitted         // set at construction: its place among the admitted connections; nil in tests without a listener
	remote string            // set at construction
	source string            // set at construction: the remote address without its port
	d      *downstream       // set at construction
	share  *budget.Share     // set at construction: what the relay holds for this peer
	since  time.Time         // set at construction: when it connected

	// Counts for the status page: requests forwarded for it each way, and refused relay-node-busy.
	toCloudly, toNode, busy atomic.Int64

	mu      sync.Mutex
	role    role                     // guarded by mu
	session contracts.RuntimeSession // guarded by mu: set once a node registration is accepted
	gone    bool                     // guarded by mu: the connection has ended; it binds no node
	// waiting (guarded by mu) is set while the connection counts as unregistered: from the upgrade
	// until a registration is accepted or the connection ends. deadline closes it when
	// RegisterDeadline passes first.
	waiting  bool
	deadline *time.Timer
	// registrations (guarded by mu) counts what the connection sent while unregistered
	// (MaxRegistrationsPerConnection); pending the registrations at Cloudly now, all of
	// pendingRole: one connection carries one peer.
	registrations int
	pending       int
	pendingRole   role
	// refusals (guarded by mu) paces the requests judge lets through to be refused while the
	// connection is unregistered (RefusedUnregisteredRate); nil until the first.
	refusals *rate.Limiter
}

// ID implements Peer.
func (p *peer) ID() uint64 { return p.id }

// Session implements Node.
func (p *peer) Session() contracts.RuntimeSession {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.session
}

// Context implements Node: it ends when the connection does.
func (p *peer) Context() context.Context { return p.conn.Context() }

func (p *peer) nodeID() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.session.NodeID
}

// counted records a request forwarded for the peer, and whether it was refused relay-node-busy.
func (p *peer) counted(direction *atomic.Int64, err error) {
	direction.Add(1)
	if errors.Is(err, contracts.RelayNodeBusy) {
		p.busy.Add(1)
	}
}

func (p *peer) roleIs(want role) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.role == want
}

// Call implements Peer: a request to the downstream peer, never blocking, charged to its share.
func (p *peer) Call(method string, body json.RawMessage, done func(json.RawMessage, error)) {
	p.call(method, body, done)
}

// call is Call that returns the call in flight (zero when done was called already).
func (p *peer) call(method string, body json.RawMessage, done func(json.RawMessage, error)) typedsocket.Pending {
	k, err := p.conn.CallAsync(method, body, func(rep typedsocket.Reply) { done(rep.Response, p.callError(rep.Err, method)) }, typedsocket.Charge(p.share))
	if err != nil {
		done(nil, p.callError(err, method))
	}
	return k
}

// callError names a local failure of a call to the peer; the peer's own errors pass untouched.
func (p *peer) callError(err error, method string) error {
	who := p.nodeID()
	if who == "" {
		who = "the peer"
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, typedsocket.ErrQueueFull):
		return contracts.RelayNodeBusy.Refuse("the send queue of %s is full", who)
	case errors.Is(err, typedsocket.ErrOverShare):
		return contracts.RelayNodeBusy.Refuse("%s holds its whole share of the relay's memory", who)
	case errors.Is(err, typedsocket.ErrTimeout):
		return contracts.RelayCallTimeout.Refuse("%s did not answer %s in time", who, method)
	case errors.Is(err, typedsocket.ErrMalformedAnswer):
		return contracts.RelayRequestInvalid.Refuse("the answer of %s to %s was malformed", who, method)
	case errors.Is(err, typedsocket.ErrClosed):
		return contracts.RelayNodeNotCarried.Refuse("%s: its connection closed before the answer", who)
	}
	return err
}

// admit admits one registration of kind (roleNode or roleIngress) of size bytes from
// p, and returns the share its request is charged to on the upstream queue and the func that ends
// it once Cloudly has answered and its answer has been applied. An unregistered connection's
// registrations are charged to the anonymous pool — MaxRegistrationsPerConnection in its
// lifetime, and the pool's count and bytes in all — a registered peer's (a node rotating) to its
// own share. One connection carries one peer: a registration of the other kind than one accepted
// or in flight is refused.
func (d *downstream) admit(p *peer, kind role, size int) (typedsocket.Share, func(), error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.role != roleNone && p.role != kind || p.pending > 0 && p.pendingRole != kind {
		return nil, nil, contracts.RelaySessionForeign.Refuse("this connection carries another peer; one connection carries one peer")
	}
	end := func() {
		p.mu.Lock()
		p.pending--
		p.mu.Unlock()
	}
	var share typedsocket.Share = p.share
	if p.role == roleNone {
		if p.registrations >= MaxRegistrationsPerConnection {
			return nil, nil, contracts.RelayNodeBusy.Refuse("this connection sent %d registrations and none was accepted", p.registrations)
		}
		if p.pending > 0 {
			return nil, nil, contracts.RelayNodeBusy.Refuse("this connection's last registration is still at Cloudly; send the next once it is answered")
		}
		if !d.anonymous.acquire(size) {
			return nil, nil, contracts.RelayNodeBusy.Refuse("the relay has its most anonymous registrations at Cloudly already")
		}
		p.registrations++
		share = nil // the pool holds it
		end = func() {
			d.anonymous.release(size)
			p.mu.Lock()
			p.pending--
			p.mu.Unlock()
		}
	}
	p.pending++
	p.pendingRole = kind
	return share, end, nil
}

// anonymousPool counts the registrations of unregistered connections at Cloudly (docs/hostile.md).
type anonymousPool struct {
	share    *budget.Share // set at construction: their bytes, in the peer memory budget
	inflight atomic.Int64
}

func (a *anonymousPool) acquire(size int) bool {
	if a.inflight.Add(1) > MaxAnonymousRegistrations {
		a.inflight.Add(-1)
		return false
	}
	if !a.share.Charge(size) {
		a.inflight.Add(-1)
		return false
	}
	return true
}

func (a *anonymousPool) release(size int) {
	a.share.Release(size)
	a.inflight.Add(-1)
}

// leaveWaitingLocked takes the connection out of the unregistered ones, when a registration is
// accepted or the connection ends. Called with p.mu held.
func (p *peer) leaveWaitingLocked() {
	if !p.waiting {
		return
	}
	p.waiting = false
	p.deadline.Stop()
	p.deadline = nil // an idle registered connection holds no timer
	p.d.waiting.Add(-1)
	p.d.sources.leave(p.source)
	p.d.unregisteredCosts.Release(unregisteredCost)
}

// registered makes p a registered peer of role ro: its share and read limit grow to a
// registered peer's.
func (p *peer) registeredLocked(ro role) {
	p.role = ro
	p.leaveWaitingLocked()
	if p.adm != nil {
		p.adm.registered()
	}
	p.conn.SetReceiveShare(p.share)
	p.conn.SetPace(nil) // a registered peer's messages are bounded by its own share
	p.share.SetLimit(p.d.cfg.registeredShare)
}

// sourceCounts counts unregistered connections per source address (docs/hostile.md).
type sourceCounts struct {
	mu  sync.Mutex
	max int            // set at construction; 0: no limit
	n   map[string]int // guarded by mu
}

// enter admits one more unregistered connection from source, or reports false at the limit.
func (s *sourceCounts) enter(source string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.max > 0 && s.n[source] >= s.max {
		return false
	}
	s.n[source]++
	return true
}

func (s *sourceCounts) leave(source string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n[source]--; s.n[source] <= 0 {
		delete(s.n, source)
	}
}
