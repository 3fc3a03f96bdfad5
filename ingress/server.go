package ingress

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// DefaultStatisticsTimeout bounds how long one statistics page waits for an ingress (project-
// defined): well inside the 60 s a caller waits for the relay, so a silent ingress costs a page
// its buckets, not the page.
const DefaultStatisticsTimeout = 20 * time.Second

// Options configure a Server. The zero value is usable: no metrics registered, nothing logged.
type Options struct {
	// Logger is the relay's logger; New adds component "ingress".
	Logger zerolog.Logger
	// Registerer receives the ingress metrics; nil registers none.
	Registerer prometheus.Registerer
	// Offer is what a registration's offer is negotiated against; zero means contracts.RelayOffer.
	Offer contracts.ProtocolOffer
	// StatisticsTimeout bounds one ingress's answer within a statistics page (20 s).
	StatisticsTimeout time.Duration
}

// Server is the cluster ingress feature; relay.go is how the relay reaches it.
type Server struct {
	log          zerolog.Logger          // set at construction
	metrics      *metrics                // set at construction
	offer        contracts.ProtocolOffer // set at construction
	statsTimeout time.Duration           // set at construction

	held    atomic.Pointer[heldTable] // the newest route table; replaced whole, never mutated
	applyMu sync.Mutex                // serializes route table updates: compare, then store

	mu      sync.RWMutex
	up      feature.Upstream       // guarded by mu: the session of the latest attach
	byPeer  map[uint64]*ingressCon // guarded by mu: accepted ingress connections
	byNode  map[string]*ingressCon // guarded by mu: the newest accepted connection of each node
	pending map[uint64]int         // guarded by mu: registrations in flight, per connection
}

// ingressCon is an accepted ingress connection. Immutable once made.
type ingressCon struct {
	peer feature.Peer
	node string
}

// New builds the ingress feature and registers its metrics; it fails only when they cannot be
// registered.
func New(opts Options) (*Server, error) {
	s := &Server{
		log:          opts.Logger.With().Str("component", "ingress").Logger(),
		metrics:      newMetrics(),
		offer:        opts.Offer,
		statsTimeout: opts.StatisticsTimeout,
		byPeer:       make(map[uint64]*ingressCon),
		byNode:       make(map[string]*ingressCon),
		pending:      make(map[uint64]int),
	}
	if s.offer == (contracts.ProtocolOffer{}) {
		s.offer = contracts.RelayOffer
	}
	if s.statsTimeout <= 0 {
		s.statsTimeout = DefaultStatisticsTimeout
	}
	s.held.Store(newHeldTable(contracts.RouteTable{}, time.Time{}))
	if err := s.metrics.register(opts.Registerer); err != nil {
		return nil, fmt.Errorf("register ingress metrics: %w", err)
	}
	return s, nil
}

// Register serves registerClusterIngress from p in the seed's server order: the bounded body (the
// relay's 64 KiB limit before registration), the offer read once as data, negotiation, the shape,
// and only then Cloudly, with the body untouched. A refusal by the relay changes nothing; Cloudly's
// answer and its refusal go back untouched. A body the relay cannot read is refused in the seed's
// registration refusal shape (registration-invalid); the relay's other refusals of a registration
// (detached, Cloudly's answer unusable) are given that shape by the relay, which knows when to
// retry. reply is called exactly once; on an acceptance p is an
// ingress connection before reply runs.
func (s *Server) Register(p feature.Peer, body json.RawMessage, reply func(json.RawMessage, error)) {
	offer, err := contracts.ReadProtocolOffer(body)
	if err != nil {
		s.registered("", errRegistrationInvalid(err), reply, nil)
		return
	}
	if refusal, _ := contracts.NegotiateProtocol(s.offer, offer); refusal != nil {
		s.registered("", refusal, reply, nil)
		return
	}
	reg, err := contracts.ReadClusterIngressRegistration(body)
	if err != nil {
		s.registered("", errRegistrationInvalid(err), reply, nil)
		return
	}
	id := p.ID()
	s.mu.Lock()
	up := s.up
	if up != nil {
		s.pending[id]++
	}
	s.mu.Unlock()
	if up == nil {
		s.registered(reg.NodeID, errDetached, reply, nil)
		return
	}
	up.Call(contracts.MethodRegisterClusterIngress, body, func(resp json.RawMessage, err error) {
		accepted := err == nil && contracts.ReadClusterIngressRegistrationAcceptance(resp)
		if err == nil && !accepted {
			resp, err = nil, errNotAcceptance
		}
		s.mu.Lock()
		live := s.pending[id] > 0 // false once PeerGone has run: the connection is over
		if live {
			if s.pending[id]--; s.pending[id] == 0 {
				delete(s.pending, id)
			}
		}
		switch {
		case live && accepted:
			s.acceptLocked(p, reg.NodeID)
		case live && cloudlyJudged(err):
			// Cloudly refused this connection's newest registration: whatever it accepted
			// before, it is not the ingress now. The relay's own failures judge nothing.
			s.revokeLocked(id)
		}
		s.mu.Unlock()
		s.registered(reg.NodeID, err, reply, resp)
	})
}

// registered counts, logs and answers one registration's outcome. Never the body or the bearer.
func (s *Server) registered(node string, err error, reply func(json.RawMessage, error), resp json.RawMessage) {
	outcome := outcomeOf(err)
	s.metrics.registrations.WithLabelValues(outcome).Inc()
	ev := s.log.Info()
	if err != nil {
		ev = s.log.Warn().Str("refusal", outcome)
	}
	if node != "" {
		ev = ev.Str("node", node)
	}
	ev.Str("method", contracts.MethodRegisterClusterIngress).Str("outcome", outcome).Msg("ingress registration")
	reply(resp, err)
}

// acceptLocked makes p the ingress connection of node. A newer accepted registration of the same
// node on another connection supersedes the older one, which stops being an ingress connection
// (one connection per node, as for Pallet nodes; the relay cannot close it from here).
func (s *Server) acceptLocked(p feature.Peer, node string) {
	id := p.ID()
	if old := s.byPeer[id]; old != nil && old.node != node && s.byNode[old.node] == old {
		delete(s.byNode, old.node)
	}
	if prev := s.byNode[node]; prev != nil && prev.peer.ID() != id {
		delete(s.byPeer, prev.peer.ID())
		s.log.Info().Str("node", node).Str("outcome", "superseded").Msg("ingress registered on a newer connection")
	}
	c := &ingressCon{peer: p, node: node}
	s.byPeer[id], s.byNode[node] = c, c
	s.metrics.connections.Set(float64(len(s.byPeer)))
}

func (s *Server) revokeLocked(id uint64) {
	c := s.byPeer[id]
	if c == nil {
		return
	}
	delete(s.byPeer, id)
	if s.byNode[c.node] == c {
		delete(s.byNode, c.node)
	}
	s.metrics.connections.Set(float64(len(s.byPeer)))
}

// IsIngress reports whether Cloudly accepted the newest ingress registration on p.
func (s *Server) IsIngress(p feature.Peer) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byPeer[p.ID()] != nil
}

// PeerGone forgets p: it is no ingress connection any more, and a registration still in flight
// for it will not make it one.
func (s *Server) PeerGone(p feature.Peer) {
	id := p.ID()
	s.mu.Lock()
	delete(s.pending, id)
	s.revokeLocked(id)
	s.mu.Unlock()
}

// Attached is called after every accepted relay registration: keep the session for forwarding
// registrations and pull the route table Cloudly holds now.
func (s *Server) Attached(up feature.Upstream) {
	s.mu.Lock()
	s.up = up
	s.mu.Unlock()
	s.pull(up)
}

// connections returns the accepted ingress connections, in no order.
func (s *Server) connections() []*ingressCon {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*ingressCon, 0, len(s.byPeer))
	for _, c := range s.byPeer {
		out = append(out, c)
	}
	return out
}

// nodes returns the newest accepted ingress connection of each node.
func (s *Server) nodes() map[string]*ingressCon {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string]*ingressCon, len(s.byNode))
	for n, c := range s.byNode {
		out[n] = c
	}
	return out
}
