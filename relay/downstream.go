package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/budget"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// Downstream connection limits. A node's queue is small on purpose: a node that stops reading
// gets relay-node-busy answers instead of holding the relay's memory.
const (
	nodeMaxQueue      = 256
	nodeMaxQueueBytes = 16 << 20
	nodeMaxInflight   = 256
)

// Shares of the peer memory budget (SPEC §15): what the relay may hold for one downstream
// connection. An unregistered connection's share is small enough that MaxUnregistered of them fit
// the default budget; its registrations are charged to the anonymous pool instead.
const (
	DefaultPeerMemoryBytes = 256 << 20
	AnonymousShare         = 16 << 10
	RegisteredShare        = 32 << 20
)

// NodeMaxUpstreamBytes bounds the bytes of one connection's requests forwarded to Cloudly and not
// yet answered: its share of the one upstream socket's queue (256 MiB), so that a node sending
// max-size messages cannot fill the queue every node shares. A request beyond it is refused
// relay-node-busy; one request always fits when none is in flight.
const NodeMaxUpstreamBytes = 32 << 20

// Downstream connections that have not registered (no accepted node or ingress registration):
// at most MaxUnregistered at once, beyond which an upgrade is answered 503, and each is closed
// (1008) when it has none RegisterDeadline after connecting and none is in flight. Every
// WebSocket peer of the relay registers first, so only an anonymous client is affected; the
// bound is above a reconnect storm of 10 000 nodes.
const (
	MaxUnregistered  = 16384
	RegisterDeadline = 60 * time.Second
)

// MaxRegistrationsInFlight bounds the registrations (node or ingress) one downstream connection
// has at Cloudly at once; more are refused relay-node-busy without being forwarded.
const MaxRegistrationsInFlight = 4

// closeSuperseded is the WebSocket close status of a connection whose node registered again on
// another connection (project-defined, in the application range).
const closeSuperseded websocket.StatusCode = 4001

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
	remote string            // set at construction
	r      *Relay            // set at construction
	share  *budget.Share     // set at construction: what the relay holds for this peer (SPEC §15)

	mu      sync.Mutex
	role    role                     // guarded by mu
	session contracts.RuntimeSession // guarded by mu: set once a node registration is accepted
	gone    bool                     // guarded by mu: the connection has ended; it binds no node
	// escrowBound (guarded by mu) is set once escrow has been told NodeBound for this connection
	// and not yet NodeGone. bindNode tells escrow outside mu, so a connection may end in between;
	// whichever of bindNode and peerGone sees both gone and escrowBound tells NodeGone, so escrow
	// always hears NodeGone after the last NodeBound of a connection that has ended.
	escrowBound bool
	// waiting (guarded by mu) is set while the connection counts in Relay.waiting: from the
	// upgrade until a registration is accepted or the connection ends. deadline closes it when
	// RegisterDeadline passes first.
	waiting  bool
	deadline *time.Timer
	// registering counts this connection's registrations at Cloudly (MaxRegistrationsInFlight).
	registering atomic.Int32
	// upstreamBytes is the size of this connection's requests at Cloudly (NodeMaxUpstreamBytes).
	upstreamBytes atomic.Int64
}

// reserveUpstream takes n bytes of the connection's share of the upstream socket; false when they
// do not fit. The first request always fits.
func (p *peer) reserveUpstream(n int) bool {
	for {
		held := p.upstreamBytes.Load()
		if held > 0 && held+int64(n) > NodeMaxUpstreamBytes {
			return false
		}
		if p.upstreamBytes.CompareAndSwap(held, held+int64(n)) {
			return true
		}
	}
}

// startRegistration takes one of the connection's registration slots; false when all are taken.
// endRegistration gives it back.
func (p *peer) startRegistration() bool {
	if p.registering.Add(1) > MaxRegistrationsInFlight {
		p.registering.Add(-1)
		return false
	}
	return true
}

func (p *peer) endRegistration() { p.registering.Add(-1) }

// errRegistrationBusy is the answer to a registration beyond MaxRegistrationsInFlight.
func errRegistrationBusy() error {
	return contracts.RelayNodeBusy.Refuse("%d registrations of this connection are already with Cloudly", MaxRegistrationsInFlight)
}

// takeBody hands over a request's body for forwarding and drops the request's hold on it: the
// request waits for its answer (up to the call timeout) and needs nothing of its body meanwhile,
// which would otherwise keep the whole frame it was read from.
func takeBody(req *typedsocket.Request) json.RawMessage {
	b := req.Body
	req.Body = nil
	return b
}

// ID implements Peer.
func (p *peer) ID() uint64 { return p.id }

// Session implements Node.
func (p *peer) Session() contracts.RuntimeSession {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.session
}

func (p *peer) nodeID() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.session.NodeID
}

// Call implements Peer: a request to the downstream peer, never blocking.
func (p *peer) Call(method string, body json.RawMessage, done func(json.RawMessage, error)) {
	err := p.conn.CallAsync(method, body, 0, func(rep typedsocket.Reply) { done(rep.Response, p.callError(rep.Err, method)) })
	if err != nil {
		done(nil, p.callError(err, method))
	}
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

// serveDownstream accepts WebSocket upgrades on every path outside /v2/.
func (r *Relay) serveDownstream(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path == "/v2" || strings.HasPrefix(req.URL.Path, "/v2/") {
		if r.feats.Registry == nil {
			http.Error(w, "registry forwarding is off on this relay", http.StatusNotFound)
			return
		}
		r.feats.Registry.ServeHTTP(w, req)
		return
	}
	if r.waiting.Add(1) > r.maxWaiting {
		r.waiting.Add(-1)
		r.metrics.unregistered.WithLabelValues("limit").Inc()
		http.Error(w, "too many connections waiting to register", http.StatusServiceUnavailable)
		return
	}
	ws, err := websocket.Accept(w, req, nil)
	if err != nil {
		r.waiting.Add(-1)
		return // Accept has answered
	}
	raw, _ := req.Context().Value(rawConnKey{}).(net.Conn)
	p := &peer{id: r.peerIDs.Add(1), remote: req.RemoteAddr, r: r, raw: raw}
	p.share = r.budget.NewShare(AnonymousShare, func() bool { return p.conn.Stalled(time.Second) }, func() {
		r.metrics.dropped.WithLabelValues("evicted-over-budget").Inc()
		r.downLog.Warn().Str("remote", p.remote).Str("node", p.nodeID()).Str("outcome", "evicted").
			Msg("closing the heaviest connection that reads nothing: the relay's peer memory budget is spent")
		go p.conn.Close(websocket.StatusPolicyViolation, "over the relay's memory budget")
	})
	p.conn = typedsocket.New(ws, typedsocket.Options{
		Handler:       typedsocket.HandlerFunc(func(_ *typedsocket.Conn, rq *typedsocket.Request) { r.servePeer(p, rq) }),
		Streams:       typedsocket.StreamHandlerFunc(func(_ *typedsocket.Conn, f *typedsocket.StreamFrame) { r.serveNodeStream(p, f) }),
		Share:         p.share,
		Dropped:       r.countDropped,
		ReadLimit:     typedsocket.DefaultReadLimit, // 64 KiB until a registration is accepted
		MaxQueue:      nodeMaxQueue,
		MaxQueueBytes: nodeMaxQueueBytes,
		MaxInflight:   nodeMaxInflight,
		Logger:        r.downLog,
		PingInterval:  r.pingInterval,
		DeadTimeout:   r.deadTimeout,
	})
	if !r.peers.add(p) {
		r.waiting.Add(-1)
		p.share.Close()
		p.conn.CloseNow() // shutting down
		return
	}
	p.mu.Lock()
	p.waiting = true
	p.deadline = time.AfterFunc(r.registerDeadline, func() { r.registrationOverdue(p) })
	p.mu.Unlock()
	r.metrics.connections.Inc()
	// Serve the connection on a fresh goroutine and let the HTTP handler return: the hijacked
	// socket is ours, and the server's goroutine, its deep stack and the upgrade request it holds
	// are released — a third of an idle connection's memory.
	go func() {
		p.conn.Run(r.serveCtx)
		r.metrics.connections.Dec()
		// peerGone before remove: shutdown waits for every peer to be removed, then closes the
		// features peerGone reports to.
		r.peerGone(p)
		r.peers.remove(p)
	}()
}

func (r *Relay) peerGone(p *peer) {
	// gone is set, and the binding removed, under p.mu: bindNode binds under it too, so a
	// registration Cloudly accepts after the connection ended cannot bind the dead connection.
	p.mu.Lock()
	p.gone = true
	p.leaveWaitingLocked()
	id := p.session.NodeID
	unbound := id != "" && r.nodes.unbind(id, p)
	tellEscrow := unbound && p.escrowBound
	p.escrowBound = false
	p.mu.Unlock()
	if unbound {
		r.metrics.nodes.Dec()
	}
	if e := r.feats.Escrow; e != nil && tellEscrow {
		e.NodeGone(p)
	}
	if in := r.feats.Ingress; in != nil {
		in.PeerGone(p)
	}
	r.streams.peerGone(p, time.Now())
	p.share.Close()
}

// servePeer dispatches one request from a downstream connection.
func (r *Relay) servePeer(p *peer, req *typedsocket.Request) {
	f := r.feats
	reply := func(body json.RawMessage, err error) { r.answer(req, body, err) }
	switch m := req.Method; {
	case m == contracts.MethodRegisterPalletRuntimeSession:
		r.registerNode(p, req)
	case m == contracts.MethodRegisterClusterIngress && f.Ingress != nil:
		if p.roleIs(roleNode) {
			reply(nil, contracts.RelaySessionForeign.Refuse("this connection carries node %s; one connection carries one peer", p.nodeID()))
			return
		}
		if !p.startRegistration() {
			reply(nil, errRegistrationBusy())
			return
		}
		f.Ingress.Register(p, takeBody(req), func(body json.RawMessage, err error) {
			defer p.endRegistration() // after the binding: a registration in flight holds off the deadline
			if err == nil && f.Ingress.IsIngress(p) {
				p.setRole(roleIngress)
				p.conn.SetReadLimit(r.cfg.MaxMessageBytes)
			}
			reply(body, err)
		})
	case m == contracts.MethodGetClusterIngressRouteTable && f.Ingress != nil:
		reply(f.Ingress.RouteTable(p, req.Body))
	case m == contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals && f.Escrow != nil:
		reply(f.Escrow.Hold(false, req.Body))
	case m == contracts.MethodGetClusterTrafficStatistics && f.Ingress != nil:
		reply(nil, contracts.RelayIngressOnly.Refuse("%s is Cloudly's to ask, of the cluster ingress", m))
	case contracts.IsLocalOnlyMethod(m):
		reply(nil, contracts.RelayMethodLocalOnly.Refuse("%s belongs to a controller on the node's own host", m))
	case contracts.IsServedToCloudly(m) || contracts.IsRelayCallToCloudly(m) || m == contracts.MethodPushRelayUpstreamChanged ||
		m == contracts.MethodRegisterClusterIngress || m == contracts.MethodGetClusterIngressRouteTable:
		reply(nil, contracts.RelayMethodUnknown.Refuse("%s is not served to this connection", m))
	default:
		r.forwardToCloudly(p, req)
	}
}

func (p *peer) roleIs(want role) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.role == want
}

func (p *peer) setRole(ro role) {
	p.mu.Lock()
	p.role = ro
	p.leaveWaitingLocked()
	p.mu.Unlock()
	p.share.SetLimit(RegisteredShare)
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
	p.r.waiting.Add(-1)
}

// registrationOverdue closes a connection that has no accepted registration RegisterDeadline
// after connecting; one with a registration at Cloudly gets another RegisterDeadline.
func (r *Relay) registrationOverdue(p *peer) {
	p.mu.Lock()
	overdue := p.waiting
	if overdue && p.registering.Load() > 0 {
		p.deadline.Reset(r.registerDeadline)
		overdue = false
	}
	p.mu.Unlock()
	if !overdue {
		return
	}
	r.metrics.unregistered.WithLabelValues("overdue").Inc()
	r.downLog.Info().Str("remote", p.remote).Str("outcome", "registration-overdue").Msg("closing a connection that did not register")
	p.conn.Close(websocket.StatusPolicyViolation, fmt.Sprintf("no accepted registration within %s", r.registerDeadline))
}

// registerNode judges a node registration in the seed's server order — the bounded body (the
// connection's 64 KiB read limit), the protocol key read once as data, negotiation — and only
// then forwards it to Cloudly untouched. A refused registration changes nothing.
func (r *Relay) registerNode(p *peer, req *typedsocket.Request) {
	outcome := func(body json.RawMessage, err error) {
		label := "accepted"
		if err != nil {
			label = refusalLabel(err)
		}
		r.metrics.nodeRegs.WithLabelValues(label).Inc()
		r.answer(req, body, err)
	}
	offer, err := contracts.ReadProtocolOffer(req.Body)
	if err != nil {
		outcome(nil, contracts.RelayRequestInvalid.Refuse("%v", err))
		return
	}
	if refusal, _ := contracts.NegotiateProtocol(contracts.RelayOffer, offer); refusal != nil {
		outcome(nil, refusal)
		return
	}
	if p.roleIs(roleIngress) {
		outcome(nil, contracts.RelaySessionForeign.Refuse("this connection is the cluster ingress; one connection carries one peer"))
		return
	}
	if r.draining.Load() {
		outcome(nil, contracts.RelayUpstreamDetached.Refuse("the relay is shutting down"))
		return
	}
	if name := r.up.custodyEnded(); name != "" {
		outcome(nil, name.Refuse("Cloudly does not dispatch to this relay"))
		return
	}
	if !p.startRegistration() {
		outcome(nil, errRegistrationBusy())
		return
	}
	r.up.Call(req.Method, takeBody(req), func(body json.RawMessage, err error) {
		defer p.endRegistration() // after the binding: a registration in flight holds off the deadline
		if err != nil {
			outcome(nil, err) // Cloudly's refusal, untouched, or the relay's own
			return
		}
		session, serr := contracts.ReadRegisterPalletRuntimeSessionResponse(body)
		if serr != nil {
			r.log.Warn().Str("component", "downstream").Str("outcome", "malformed").Msg("Cloudly accepted a node registration with an unreadable session")
			outcome(nil, contracts.RelayRequestInvalid.Refuse("Cloudly's registration answer carries no readable session"))
			return
		}
		if err := r.bindNode(p, session); err != nil {
			outcome(nil, err)
			return
		}
		outcome(body, nil)
	})
}

// bindNode binds p to its node session. A later accepted registration of the same node on
// another connection supersedes the old one, which is closed; a rotation on the same connection
// only replaces the binding.
func (r *Relay) bindNode(p *peer, s contracts.RuntimeSession) error {
	p.mu.Lock()
	if p.gone {
		// Cloudly answered after the connection ended: binding it would route the node to a dead
		// connection for ever and close the node's live one as superseded.
		p.mu.Unlock()
		return contracts.RelayNodeNotCarried.Refuse("%s: its connection closed before the answer", s.NodeID)
	}
	if p.session.NodeID != "" && p.session.NodeID != s.NodeID {
		carried := p.session.NodeID
		p.mu.Unlock()
		return contracts.RelaySessionForeign.Refuse("this connection carries node %s; one connection carries one node", carried)
	}
	first := p.session.NodeID == ""
	p.session, p.role = s, roleNode
	p.leaveWaitingLocked()
	old := r.nodes.bind(s.NodeID, p) // under p.mu, ordered with peerGone's unbind
	p.mu.Unlock()
	if first {
		p.conn.SetReadLimit(r.cfg.MaxMessageBytes)
		p.share.SetLimit(RegisteredShare)
	}
	if old != nil && old != p {
		r.log.Info().Str("component", "downstream").Str("node", s.NodeID).Str("outcome", "superseded").Msg("node registered on a newer connection")
		go old.conn.Close(closeSuperseded, "superseded by a newer registration of this node")
	} else if old == nil {
		r.metrics.nodes.Inc()
	}
	r.log.Info().Str("component", "downstream").Str("node", s.NodeID).Str("outcome", "accepted").Msg("node registered")
	if e := r.feats.Escrow; e != nil {
		e.NodeBound(p)
		// The connection may have ended since it was bound, its end reported before escrow heard
		// of the binding: escrow must not keep a dead connection as the node's carrier.
		p.mu.Lock()
		p.escrowBound = !p.gone
		ended := p.gone
		p.mu.Unlock()
		if ended {
			e.NodeGone(p)
		}
	}
	return nil
}

// forwardToCloudly forwards a node's request, only from that node's own connection.
func (r *Relay) forwardToCloudly(p *peer, req *typedsocket.Request) {
	node := p.nodeID()
	if node == "" {
		r.answer(req, nil, contracts.RelaySessionForeign.Refuse("%s from a connection with no node session; register first", req.Method))
		return
	}
	// SPEC §5: every node → Cloudly request carries the node's own session. The upstream socket is
	// authenticated as the relay, so nothing without one may ride on it.
	switch claimed, present, err := contracts.ReadSessionNodeID(req.Body); {
	case err != nil:
		r.answer(req, nil, contracts.RelayRequestInvalid.Refuse("%v", err))
		return
	case !present:
		r.answer(req, nil, contracts.RelaySessionForeign.Refuse("%s carries no session of node %s", req.Method, node))
		return
	case claimed != node:
		r.answer(req, nil, contracts.RelaySessionForeign.Refuse("%s names another node's session on node %s's connection", req.Method, node))
		return
	}
	if err := r.bindMarkers(p, req.Body); err != nil {
		r.answer(req, nil, err)
		return
	}
	if r.draining.Load() {
		r.answer(req, nil, contracts.RelayUpstreamDetached.Refuse("the relay is shutting down"))
		return
	}
	start, size := time.Now(), len(req.Body)
	if !p.reserveUpstream(size) {
		r.answer(req, nil, contracts.RelayNodeBusy.Refuse("node %s has %d MiB of requests at Cloudly already", node, NodeMaxUpstreamBytes>>20))
		return
	}
	r.up.Call(req.Method, takeBody(req), func(body json.RawMessage, err error) {
		p.upstreamBytes.Add(-int64(size))
		if err == nil {
			err = r.bindMarkers(p, body) // a stream in Cloudly's answer flows to this node
		}
		r.forwarded("to_cloudly", err)
		r.logForward(req.Method, node, size, err, start)
		r.answer(req, body, err)
	})
}

// routeToNode routes a Cloudly → node request by request.session.nodeId, else request.nodeId.
func (r *Relay) routeToNode(req *typedsocket.Request) {
	node, ok, err := contracts.ReadRouteNodeID(req.Body)
	switch {
	case err != nil:
		r.refuseCloudly(req, "", contracts.RelayRequestInvalid.Refuse("%s: body is not a readable JSON object", req.Method))
		return
	case !ok || !contracts.IsClusterNodeID(node):
		r.refuseCloudly(req, "", contracts.RelayRequestInvalid.Refuse("%s names no node (session.nodeId or nodeId)", req.Method))
		return
	}
	p := r.nodes.get(node)
	if r.draining.Load() {
		p = nil // the relay is shutting down: its nodes are about to be carried by no one
	}
	if p == nil {
		r.refuseCloudly(req, node, contracts.RelayNodeNotCarried.Refuse("%s", node))
		return
	}
	if err := r.bindMarkers(p, req.Body); err != nil {
		r.refuseCloudly(req, node, err)
		return
	}
	start, size := time.Now(), len(req.Body)
	p.Call(req.Method, takeBody(req), func(body json.RawMessage, err error) {
		if err == nil {
			err = r.bindMarkers(p, body) // a stream in the node's answer flows from this node
		}
		r.forwarded("to_node", err)
		r.logForward(req.Method, node, size, err, start)
		r.answer(req, body, err)
	})
}

// refuseCloudly answers a Cloudly request the relay cannot route, and says so in the log: Cloudly
// is the one peer whose misrouted requests an operator must be able to see. Sampled, so that a
// burst cannot flood the log.
func (r *Relay) refuseCloudly(req *typedsocket.Request, node string, err error) {
	r.refusalLog.Info().Str("component", "upstream").Str("method", req.Method).Str("node", node).
		Str("outcome", refusalLabel(err)).Msg("refused a Cloudly request")
	r.answer(req, nil, err)
}

// answer sends the outcome of a request and counts the relay's own refusals.
func (r *Relay) answer(req *typedsocket.Request, body json.RawMessage, err error) {
	if err != nil {
		r.metrics.refused(err)
	}
	req.Answer(typedsocket.Reply{Response: body, Err: err})
}

func (r *Relay) forwarded(direction string, err error) {
	outcome := "answered"
	var remote *typedsocket.Error
	switch {
	case errors.As(err, &remote):
		outcome = "error"
	case err != nil:
		outcome = "refused"
	}
	r.metrics.forwarded.WithLabelValues(direction, outcome).Inc()
}

// logForward logs a forwarded request at debug level: method, node, size, outcome, never a body.
func (r *Relay) logForward(method, node string, size int, err error, start time.Time) {
	if !r.log.Debug().Enabled() {
		return
	}
	var ev *zerolog.Event
	if err != nil {
		ev = r.log.Debug().Str("outcome", refusalLabel(err))
	} else {
		ev = r.log.Debug().Str("outcome", "answered")
	}
	ev.Str("component", "downstream").Str("method", method).Str("node", node).Int("bytes", size).
		Dur("latency", time.Since(start)).Msg("forwarded")
}

// refusalLabel is the refusal name an error carries, for metrics and logs (never its text).
func refusalLabel(err error) string {
	var r *contracts.Refusal
	var pr *contracts.ProtocolRefusal
	var remote *typedsocket.Error
	switch {
	case errors.As(err, &r):
		return string(r.Name)
	case errors.As(err, &pr):
		return contracts.ProtocolIncompatibleCode
	case errors.As(err, &remote):
		if n := remote.Name(); n != "" {
			return string(n)
		}
		if _, ok := contracts.ReadProtocolRefusal(remote.Data); ok {
			return contracts.ProtocolIncompatibleCode
		}
		return "remote-error"
	}
	return "failed"
}

// announceAttached tells every node and ingress connection the relay is attached again, after
// which nodes register again themselves. A peer whose queue is full misses the hint (counted);
// it learns the state from its next request.
func (r *Relay) announceAttached() {
	body := json.RawMessage(`{"attached":true}`)
	for _, p := range r.peers.snapshot() {
		if p.roleIs(roleNone) {
			continue
		}
		p.Call(contracts.MethodPushRelayUpstreamChanged, body, func(_ json.RawMessage, err error) {
			if err != nil && errors.Is(err, contracts.RelayNodeBusy) {
				r.metrics.dropped.WithLabelValues("upstream-changed-queue-full").Inc()
			}
		})
	}
}

// nodeTable maps node ids to the connection carrying them.
type nodeTable struct {
	mu   sync.Mutex
	byID map[string]*peer // guarded by mu
}

// bind makes p the carrier of id and returns the previous carrier, if any.
func (t *nodeTable) bind(id string, p *peer) *peer {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.byID[id]
	t.byID[id] = p
	return old
}

// unbind removes id if p still carries it.
func (t *nodeTable) unbind(id string, p *peer) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byID[id] != p {
		return false
	}
	delete(t.byID, id)
	return true
}

func (t *nodeTable) get(id string) *peer {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byID[id]
}

// peerSet is every open downstream connection.
type peerSet struct {
	mu     sync.Mutex
	byID   map[uint64]*peer // guarded by mu
	closed bool             // guarded by mu: shutting down, no new peers
	wg     sync.WaitGroup
}

func (s *peerSet) add(p *peer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.byID[p.id] = p
	s.wg.Add(1)
	return true
}

func (s *peerSet) remove(p *peer) {
	s.mu.Lock()
	delete(s.byID, p.id)
	s.mu.Unlock()
	s.wg.Done()
}

func (s *peerSet) snapshot() []*peer {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*peer, 0, len(s.byID))
	for _, p := range s.byID {
		out = append(out, p)
	}
	return out
}

// closeAll stops new peers and closes every open one with 1001, waiting at most until ctx ends.
func (s *peerSet) closeAll(ctx context.Context) {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	for _, p := range s.snapshot() {
		go p.conn.Close(websocket.StatusGoingAway, "relay shutting down")
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		// The library's close handshake waits for the peer on its own timeouts, and CloseNow waits
		// for that handshake; closing the socket under it ends both at once.
		for _, p := range s.snapshot() {
			if p.raw != nil {
				p.raw.Close()
			}
			p.conn.CloseNow()
		}
		<-done
	}
}

// rawConnKey carries a downstream connection's socket in its request context
// (http.Server.ConnContext), for closing it under the WebSocket when a close overruns.
type rawConnKey struct{}

func (s *peerSet) queued() float64 {
	n := 0
	for _, p := range s.snapshot() {
		n += p.conn.QueueLen()
	}
	return float64(n)
}
