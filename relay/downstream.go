package relay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/budget"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// downstream is the relay's listener side (docs/protocol.md#node-runtime-sessions and docs/hostile.md): every downstream connection, the nodes
// they carry, and the bounds on what they may hold — the peer memory budget, the connections that
// have not registered, their registrations at Cloudly. It owns that state, as upstream owns the
// Cloudly socket. What a connection's requests mean is the relay's: it is handed in as hooks.
type downstream struct {
	cfg   downstreamConfig // set at construction
	log   zerolog.Logger   // set at construction: shared by every downstream connection
	m     *metrics         // set at construction
	hooks downstreamHooks  // set at construction

	budget *budget.Budget // set at construction: bytes held for downstream peers (docs/hostile.md)
	// unregisteredCosts holds what every connection that has not registered costs on its own —
	// its unfinished request headers, then its state (peer.go), and the message it is sending —
	// at most 1/unregisteredPart of the budget, so that registered peers keep the rest; never
	// evicted.
	unregisteredCosts *budget.Share
	anonymous         *anonymousPool // set at construction: registrations of unregistered connections
	partials          *partials      // set at construction: their messages being received, oldest first (pace.go)
	sources           *sourceCounts  // set at construction: unregistered connections per source address
	waiting           atomic.Int64   // connections without an accepted registration

	adm     *admission // set at construction: every connection from its accept, before TLS
	peers   peerSet
	nodes   nodeTable
	peerIDs atomic.Uint64

	// ctx is what every connection runs under; stop ends it, once every connection is closed
	// (Relay.Serve). Both set at construction.
	ctx  context.Context
	stop context.CancelFunc
}

// downstreamConfig is what the downstream is told.
type downstreamConfig struct {
	maxMessageBytes  int64            // --max-message-bytes: a registered connection's read limit
	peerMemoryBytes  int64            // --peer-memory-bytes
	maxPerSource     int              // --max-unregistered-per-source; 0: no limit
	maxWaiting       int64            // unregistered connections at once (MaxUnregistered)
	registerDeadline time.Duration    // a connection registers within it or is closed (RegisterDeadline)
	registeredShare  int64            // what one registered peer may hold (RegisteredShare)
	anonymousBytes   int64            // the anonymous pool's bytes (AnonymousRegistrationBytes)
	maxConns         int              // connections open at once; 0: RLIMIT_NOFILE less fdReserve
	plaintext        bool             // --insecure-plaintext: no TLS on the listener
	pace             typedsocket.Pace // --first-frame-timeout, --min-frame-rate: an unregistered connection's messages
	upgradeRate      float64          // --upgrade-rate-per-source: upgrades a second from one address under load
	upgradeBurst     int              // --upgrade-burst-per-source
	timings          timings
	now              func() time.Time // the relay's clock (Options.Now); nil: time.Now
}

// downstreamHooks are what the relay does with a connection: serve its requests and stream
// frames, and hear that it ended (after the downstream has let go of it, before it is removed).
type downstreamHooks struct {
	serve       func(p *peer, req *typedsocket.Request)
	serveStream func(p *peer, f *typedsocket.StreamFrame)
	gone        func(p *peer)
	dropped     func(reason string)
}

// timings are every socket's; zero means the docs/protocol.md#framing-typedrequest-over-websocket defaults. Tests shorten them.
type timings struct {
	pingInterval, deadTimeout, callTimeout time.Duration
}

func newDownstream(cfg downstreamConfig, log zerolog.Logger, m *metrics, hooks downstreamHooks) *downstream {
	if cfg.maxWaiting <= 0 {
		cfg.maxWaiting = MaxUnregistered
	}
	if cfg.registerDeadline <= 0 {
		cfg.registerDeadline = RegisterDeadline
	}
	if cfg.registeredShare <= 0 {
		cfg.registeredShare = RegisteredShare
	}
	if cfg.anonymousBytes <= 0 {
		cfg.anonymousBytes = AnonymousRegistrationBytes
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	if cfg.peerMemoryBytes <= 0 { // a Config that was not completed
		cfg.peerMemoryBytes = DefaultPeerMemoryBytes
	}
	d := &downstream{cfg: cfg, log: log, m: m, hooks: hooks,
		budget:  budget.New(cfg.peerMemoryBytes),
		sources: &sourceCounts{max: cfg.maxPerSource, n: make(map[string]int)}}
	d.ctx, d.stop = context.WithCancel(context.Background())
	d.anonymous = &anonymousPool{share: d.budget.NewShare(cfg.anonymousBytes, nil, nil)}
	d.adm = &admission{m: m, refusals: make(chan struct{}, refusing)}
	d.unregisteredCosts = d.budget.NewPartition(d.budget.Limit() / unregisteredPart)
	d.partials = newPartials(d.budget, d.unregisteredCosts)
	if d.cfg.pace == (typedsocket.Pace{}) { // a Config that was not completed
		d.cfg.pace = typedsocket.Pace{First: DefaultFirstFrameTimeout, MinRate: DefaultMinFrameRate}
	}
	if cfg.maxConns <= 0 {
		cfg.maxConns = descriptorLimit() - fdReserve
		if cfg.maxConns <= 0 {
			cfg.maxConns = math.MaxInt
		}
		d.cfg.maxConns = cfg.maxConns
	}
	d.adm.max, d.adm.headers, d.adm.plaintext = cfg.maxConns, d.unregisteredCosts, cfg.plaintext
	if cfg.upgradeRate <= 0 || cfg.upgradeBurst <= 0 { // a Config that was not completed
		cfg.upgradeRate, cfg.upgradeBurst = DefaultUpgradeRatePerSource, DefaultUpgradeBurstPerSource
	}
	d.adm.rates = newSourceRates(cfg.upgradeRate, cfg.upgradeBurst)
	d.nodes.byID = make(map[string]*peer)
	d.peers.byID = make(map[uint64]*peer)
	return d
}

// accept upgrades a request to a downstream connection and runs it. An upgrade beyond the
// unregistered bounds is answered 503 with Retry-After.
func (d *downstream) accept(w http.ResponseWriter, req *http.Request) {
	source := sourceOf(req.RemoteAddr)
	refuse := func(reason, text string) {
		d.m.unregistered.WithLabelValues(reason).Inc()
		w.Header().Set("Retry-After", retryAfterSeconds)
		w.Header().Set("Connection", "close")
		http.Error(w, text, http.StatusServiceUnavailable)
	}
	if d.waiting.Add(1) > d.cfg.maxWaiting {
		d.waiting.Add(-1)
		refuse("limit", "too many connections waiting to register")
		return
	}
	if !d.sources.enter(source) {
		d.waiting.Add(-1)
		refuse("source-limit", "too many connections from this address waiting to register")
		return
	}
	raw, _ := req.Context().Value(rawConnKey{}).(net.Conn)
	adm := admittedOf(raw)
	// The connection's own cost is what its request headers were charged, handed over (admission);
	// only a connection that came some other way (none does but in tests) is charged anew.
	if !adm.becomeUnregistered(unregisteredCost) && !d.unregisteredCosts.Charge(unregisteredCost) {
		d.waiting.Add(-1)
		d.sources.leave(source)
		refuse("budget", "the relay's peer memory budget is spent")
		return
	}
	leave := func() { d.waiting.Add(-1); d.sources.leave(source); d.unregisteredCosts.Release(unregisteredCost) }
	pongs := new(typedsocket.Pongs)
	ws, err := websocket.Accept(w, req, &websocket.AcceptOptions{OnPingReceived: pongs.OnPingReceived})
	if err != nil {
		leave()
		return // Accept has answered
	}
	p := &peer{id: d.peerIDs.Add(1), remote: req.RemoteAddr, source: source, d: d, raw: raw, adm: adm, since: d.cfg.now()}
	p.share = d.budget.NewShare(AnonymousShare, func() (int64, bool) { return waiting(p.conn) }, func() {
		d.m.dropped.WithLabelValues("evicted-over-budget").Inc()
		d.log.Warn().Str("remote", p.remote).Str("node", p.nodeID()).Str("outcome", "evicted").
			Msg("closing the heaviest connection that reads nothing: the relay's peer memory budget is spent")
		p.conn.Evict() // it reads nothing: a close handshake would wait on it in vain
	})
	t := d.cfg.timings
	p.conn = typedsocket.New(ws, typedsocket.Options{
		Handler:       typedsocket.HandlerFunc(func(_ *typedsocket.Conn, rq *typedsocket.Request) { d.hooks.serve(p, rq) }),
		Streams:       typedsocket.StreamHandlerFunc(func(_ *typedsocket.Conn, f *typedsocket.StreamFrame) { d.hooks.serveStream(p, f) }),
		Share:         p.share,
		Raw:           raw,
		Pongs:         pongs,
		Dropped:       d.hooks.dropped,
		ReadLimit:     typedsocket.DefaultReadLimit, // 64 KiB until a registration is accepted
		Pace:          &d.cfg.pace,                  // until a registration is accepted
		Judge:         func(method string) bool { return d.judge(p, method) },
		MaxQueue:      nodeMaxQueue,
		MaxQueueBytes: int(d.cfg.registeredShare), // a registered peer's share bounds it first
		MaxInflight:   nodeMaxInflight,
		Logger:        d.log,
		PingInterval:  t.pingInterval,
		DeadTimeout:   t.deadTimeout,
		CallTimeout:   t.callTimeout,
	})
	// Until it registers, what it sends is charged with every unregistered connection's, in turn:
	// past the partition the connection holding a partial message longest is closed.
	p.conn.SetReceiveShare(d.partials.holder(func() {
		d.m.unregistered.WithLabelValues("partial-oldest").Inc() // counted, never logged one by one
		p.conn.Evict()
	}))
	if !d.peers.add(p) {
		leave()
		p.share.Close()
		p.conn.CloseNow() // shutting down
		return
	}
	p.mu.Lock()
	p.waiting = true
	p.deadline = time.AfterFunc(d.cfg.registerDeadline, func() { d.registrationOverdue(p) })
	p.mu.Unlock()
	d.m.connections.Inc()
	// Serve the connection on a fresh goroutine and let the HTTP handler return: the hijacked
	// socket is ours, and the server's goroutine, its deep stack and the upgrade request it holds
	// are released — a third of an idle connection's memory.
	go func() {
		if err := p.conn.Run(d.ctx); errors.Is(err, typedsocket.ErrTooSlow) {
			d.m.unregistered.WithLabelValues("frame-slow").Inc() // counted, never logged one by one
		}
		d.m.connections.Dec()
		// gone before remove: shutdown waits for every peer to be removed, then stops the
		// parts the relay's gone hook reports to.
		d.gone(p)
		d.peers.remove(p)
	}()
}

// gone lets go of an ended connection: it counts as unregistered no more, carries its node no
// more, and the relay hears of it.
func (d *downstream) gone(p *peer) {
	// gone is set, and the binding removed, under p.mu: bind binds under it too, so a
	// registration Cloudly accepts after the connection ended cannot bind the dead connection.
	p.mu.Lock()
	p.gone = true
	p.leaveWaitingLocked()
	id := p.session.NodeID
	unbound := id != "" && d.nodes.unbind(id, p)
	p.mu.Unlock()
	if unbound {
		d.m.nodes.Dec()
	}
	d.hooks.gone(p)
	p.share.Close()
}

// bind binds p to its node session. A later accepted registration of the same node on another
// connection supersedes the old one, which is closed; a rotation on the same connection only
// replaces the binding. A connection that ended meanwhile binds nothing.
func (d *downstream) bind(p *peer, s contracts.RuntimeSession) error {
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
	p.session = s
	p.registeredLocked(roleNode)
	old := d.nodes.bind(s.NodeID, p) // under p.mu, ordered with gone's unbind
	p.mu.Unlock()
	if first {
		p.conn.SetReadLimit(d.cfg.maxMessageBytes)
	}
	if old != nil && old != p {
		d.log.Info().Str("node", s.NodeID).Str("outcome", "superseded").Msg("node registered on a newer connection")
		go old.conn.Close(closeSuperseded, "superseded by a newer registration of this node")
	} else if old == nil {
		d.m.nodes.Inc()
	}
	d.log.Info().Str("node", s.NodeID).Str("outcome", "accepted").Msg("node registered")
	return nil
}

// registered makes p a peer of role ro once a registration a part judged is accepted. A
// connection that ended meanwhile takes no role.
func (d *downstream) registered(p *peer, ro role) {
	p.mu.Lock()
	first := p.role == roleNone && !p.gone
	if !p.gone {
		p.registeredLocked(ro)
	}
	p.mu.Unlock()
	if first {
		p.conn.SetReadLimit(d.cfg.maxMessageBytes)
	}
}

// registrationOverdue closes a connection that has no accepted registration RegisterDeadline
// after its upgrade, whether or not one is at Cloudly: the deadline is never extended (docs/hostile.md),
// so an anonymous connection cannot live on by keeping a registration in flight.
func (d *downstream) registrationOverdue(p *peer) {
	p.mu.Lock()
	overdue := p.waiting
	p.mu.Unlock()
	if !overdue {
		return
	}
	d.m.unregistered.WithLabelValues("overdue").Inc()
	d.log.Info().Str("remote", p.remote).Str("outcome", "registration-overdue").Msg("closing a connection that did not register")
	if d.adm.pressed() {
		p.conn.Evict() // under load, no close handshake (pressure.go)
		return
	}
	p.conn.Close(websocket.StatusPolicyViolation, fmt.Sprintf("no accepted registration within %s", d.cfg.registerDeadline))
}

// carried are the open connections that carry a node or an ingress.
func (d *downstream) carried() []*peer {
	all := d.peers.snapshot()
	out := all[:0]
	for _, p := range all {
		if !p.roleIs(roleNone) {
			out = append(out, p)
		}
	}
	return out
}

// inflight is the number of requests in flight on every downstream connection, either way.
func (d *downstream) inflight() int64 {
	var n int64
	for _, p := range d.peers.snapshot() {
		n += p.conn.Inflight()
	}
	return n
}

func isWebSocketUpgrade(req *http.Request) bool {
	return headerHasToken(req.Header, "Connection", "upgrade") && headerHasToken(req.Header, "Upgrade", "websocket")
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// sourceOf is the remote address without its port.
func sourceOf(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return host
	}
	return remote
}

// rawConnKey carries a downstream connection's socket in its request context
// (http.Server.ConnContext), for closing it under the WebSocket when a close overruns.
type rawConnKey struct{}
