package relay

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// serveDownstream serves the downstream listener: /v2/ to registry forwarding, a WebSocket
// upgrade on every other path. An upgrade beyond the unregistered bounds is answered 503 with
// Retry-After; any other plain HTTP request is answered and its connection closed, so that an
// anonymous client holds no idle keep-alive connection outside every WebSocket bound.
func (r *Relay) serveDownstream(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path == "/v2" || strings.HasPrefix(req.URL.Path, "/v2/") {
		if r.v2 == nil {
			w.Header().Set("Connection", "close")
			http.Error(w, "registry forwarding is off on this relay", http.StatusNotFound)
			return
		}
		r.v2.ServeHTTP(w, req)
		return
	}
	if !isWebSocketUpgrade(req) {
		w.Header().Set("Connection", "close")
		w.Header().Set("Upgrade", "websocket")
		http.Error(w, "this endpoint serves TypedRequest over WebSocket", http.StatusUpgradeRequired)
		return
	}
	source := sourceOf(req.RemoteAddr)
	refuse := func(reason, text string) {
		r.metrics.unregistered.WithLabelValues(reason).Inc()
		w.Header().Set("Retry-After", retryAfterSeconds)
		w.Header().Set("Connection", "close")
		http.Error(w, text, http.StatusServiceUnavailable)
	}
	if r.waiting.Add(1) > r.maxWaiting {
		r.waiting.Add(-1)
		refuse("limit", "too many connections waiting to register")
		return
	}
	if !r.sources.enter(source) {
		r.waiting.Add(-1)
		refuse("source-limit", "too many connections from this address waiting to register")
		return
	}
	if !r.unregisteredCosts.Charge(unregisteredCost) {
		r.waiting.Add(-1)
		r.sources.leave(source)
		refuse("budget", "the relay's peer memory budget is spent")
		return
	}
	leave := func() { r.waiting.Add(-1); r.sources.leave(source); r.unregisteredCosts.Release(unregisteredCost) }
	pongs := new(typedsocket.Pongs)
	ws, err := websocket.Accept(w, req, &websocket.AcceptOptions{OnPingReceived: pongs.OnPingReceived})
	if err != nil {
		leave()
		return // Accept has answered
	}
	raw, _ := req.Context().Value(rawConnKey{}).(net.Conn)
	p := &peer{id: r.peerIDs.Add(1), remote: req.RemoteAddr, source: source, r: r, raw: raw, since: time.Now()}
	p.share = r.budget.NewShare(AnonymousShare, func() bool { return p.conn.Stalled(evictionStall) }, func() {
		r.metrics.dropped.WithLabelValues("evicted-over-budget").Inc()
		r.downLog.Warn().Str("remote", p.remote).Str("node", p.nodeID()).Str("outcome", "evicted").
			Msg("closing the heaviest connection that reads nothing: the relay's peer memory budget is spent")
		p.conn.Evict() // it reads nothing: a close handshake would wait on it in vain
	})
	p.conn = typedsocket.New(ws, typedsocket.Options{
		Handler:       typedsocket.HandlerFunc(func(_ *typedsocket.Conn, rq *typedsocket.Request) { r.servePeer(p, rq) }),
		Streams:       typedsocket.StreamHandlerFunc(func(_ *typedsocket.Conn, f *typedsocket.StreamFrame) { r.serveNodeStream(p, f) }),
		Share:         p.share,
		Raw:           raw,
		Pongs:         pongs,
		Dropped:       r.countDropped,
		ReadLimit:     typedsocket.DefaultReadLimit, // 64 KiB until a registration is accepted
		MaxQueue:      nodeMaxQueue,
		MaxQueueBytes: nodeMaxQueueBytes,
		MaxInflight:   nodeMaxInflight,
		Logger:        r.downLog,
		PingInterval:  r.pingInterval,
		DeadTimeout:   r.deadTimeout,
		CallTimeout:   r.callTimeout,
	})
	if !r.peers.add(p) {
		leave()
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
		// peerGone before remove: shutdown waits for every peer to be removed, then stops the
		// components peerGone reports to.
		r.peerGone(p)
		r.peers.remove(p)
	}()
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

func (r *Relay) peerGone(p *peer) {
	// gone is set, and the binding removed, under p.mu: bindNode binds under it too, so a
	// registration Cloudly accepts after the connection ended cannot bind the dead connection.
	p.mu.Lock()
	p.gone = true
	p.leaveWaitingLocked()
	id := p.session.NodeID
	unbound := id != "" && r.nodes.unbind(id, p)
	p.mu.Unlock()
	if unbound {
		r.metrics.nodes.Dec()
	}
	for _, o := range r.observers {
		o.PeerGone(p)
	}
	r.streams.peerGone(p, time.Now())
	p.share.Close()
}

// registrationOverdue closes a connection that has no accepted registration RegisterDeadline
// after its upgrade, whether or not one is at Cloudly: the deadline is never extended (SPEC §15),
// so an anonymous connection cannot live on by keeping a registration in flight.
func (r *Relay) registrationOverdue(p *peer) {
	p.mu.Lock()
	overdue := p.waiting
	p.mu.Unlock()
	if !overdue {
		return
	}
	r.metrics.unregistered.WithLabelValues("overdue").Inc()
	r.downLog.Info().Str("remote", p.remote).Str("outcome", "registration-overdue").Msg("closing a connection that did not register")
	p.conn.Close(websocket.StatusPolicyViolation, fmt.Sprintf("no accepted registration within %s", r.registerDeadline))
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

func (s *peerSet) queued() float64 {
	n := 0
	for _, p := range s.snapshot() {
		n += p.conn.QueueLen()
	}
	return float64(n)
}

// rawConnKey carries a downstream connection's socket in its request context
// (http.Server.ConnContext), for closing it under the WebSocket when a close overruns.
type rawConnKey struct{}
