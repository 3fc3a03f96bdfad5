package relay

import (
	"encoding/json"
	"sync"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// registerNode judges a node registration in the seed's server order — the bounded body (the
// connection's 64 KiB read limit), the protocol key read once as data, negotiation — and only
// then forwards it to Cloudly untouched. A refused registration changes nothing.
func (r *Relay) registerNode(p *peer, req *typedsocket.Request) {
	outcome := func(body json.RawMessage, err error) {
		label := "accepted"
		if err != nil {
			label = contracts.RefusalLabel(err)
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
	if r.draining.Load() {
		outcome(nil, contracts.RelayUpstreamDetached.Refuse("the relay is shutting down"))
		return
	}
	if name := r.custody.endedBy(); name != "" {
		outcome(nil, name.Refuse("Cloudly does not dispatch to this relay"))
		return
	}
	share, end, err := r.beginRegistration(p, roleNode, len(req.Body))
	if err != nil {
		outcome(nil, err)
		return
	}
	r.up.callFor(share, req.Method, takeBody(req), func(body json.RawMessage, err error) {
		defer end()
		if err != nil {
			outcome(nil, err) // Cloudly's refusal, untouched, or the relay's own
			return
		}
		session, serr := contracts.ReadRegisterPalletRuntimeSessionResponse(body)
		if serr != nil {
			r.downLog.Warn().Str("outcome", "malformed").Msg("Cloudly accepted a node registration with an unreadable session")
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

// registerVia serves a registration a feature judges and forwards (registrationRoles): the relay
// admits it, and makes p a peer of role ro when the feature answers it accepted. A connection that
// ended meanwhile takes no role.
func (r *Relay) registerVia(f Feature, ro role, p *peer, req *typedsocket.Request) {
	_, end, err := r.beginRegistration(p, ro, len(req.Body))
	if err != nil {
		r.answer(req, nil, err)
		return
	}
	f.ServeDownstream(req.Method, p, takeBody(req), func(body json.RawMessage, err error) {
		defer end()
		if err == nil {
			p.mu.Lock()
			first := p.role == roleNone && !p.gone
			if !p.gone {
				p.registeredLocked(ro)
			}
			p.mu.Unlock()
			if first {
				p.conn.SetReadLimit(r.cfg.MaxMessageBytes)
			}
		}
		r.answer(req, body, err)
	})
}

// bindNode binds p to its node session. A later accepted registration of the same node on
// another connection supersedes the old one, which is closed; a rotation on the same connection
// only replaces the binding. Observers hear NodeBound after the binding; one that keeps p follows
// its end through p.Context(), so a connection that ends meanwhile is never kept as a carrier.
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
	p.session = s
	p.registeredLocked(roleNode)
	old := r.nodes.bind(s.NodeID, p) // under p.mu, ordered with peerGone's unbind
	p.mu.Unlock()
	if first {
		p.conn.SetReadLimit(r.cfg.MaxMessageBytes)
	}
	if old != nil && old != p {
		r.downLog.Info().Str("node", s.NodeID).Str("outcome", "superseded").Msg("node registered on a newer connection")
		go old.conn.Close(closeSuperseded, "superseded by a newer registration of this node")
	} else if old == nil {
		r.metrics.nodes.Inc()
	}
	r.downLog.Info().Str("node", s.NodeID).Str("outcome", "accepted").Msg("node registered")
	for _, o := range r.observers {
		o.NodeBound(p)
	}
	return nil
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
