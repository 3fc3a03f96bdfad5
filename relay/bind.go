package relay

import (
	"encoding/json"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
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
	share, end, err := r.down.admit(p, roleNode, len(req.Body))
	if err != nil {
		outcome(nil, err)
		return
	}
	// Digested before it is forwarded: the body itself is never kept (docs/escrow.md).
	var digest [32]byte
	rb := r.parts.rebinder
	if rb != nil {
		digest = rb.RegistrationDigest(req.Body)
	}
	// The registration stops counting as pending before its answer is queued: under load a peer
	// that sends again once it has the answer must not find it still pending (judge).
	answered := outcome
	outcome = func(body json.RawMessage, err error) { end(); answered(body, err) }
	if rb != nil && !r.up.Attached() {
		if kept, ok := rb.Rebind(digest); ok {
			r.rebind(p, kept, outcome)
			return
		}
		outcome(nil, contracts.RelayUpstreamDetached.Refuse("the relay has no Cloudly session"))
		return
	}
	// A node rotating on its connection states that connection's node; a first registration
	// states none: the connection carries no node before Cloudly accepts one.
	r.up.callFor(share, p.nodeID(), req.Method, takeBody(req), func(body json.RawMessage, err error) {
		if err != nil {
			outcome(nil, err) // Cloudly's refusal, untouched, or the relay's own
			return
		}
		session, serr := contracts.ReadRegisterPalletRuntimeSessionResponse(body)
		if serr != nil {
			r.down.log.Warn().Str("outcome", "malformed").Msg("Cloudly accepted a node registration with an unreadable session")
			outcome(nil, contracts.RelayRequestInvalid.Refuse("Cloudly's registration answer carries no readable session"))
			return
		}
		if err := r.bindNode(p, session); err != nil {
			outcome(nil, err)
			return
		}
		if rb != nil {
			rb.Accepted(session.NodeID, digest, body)
		}
		outcome(body, nil)
	})
}

// rebind answers, while detached, a registration identical to one Cloudly accepted with the answer
// Cloudly gave it, and binds the connection to that session again (docs/escrow.md, detached
// re-binding): escrow releases resume on it.
func (r *Relay) rebind(p *peer, kept json.RawMessage, outcome func(json.RawMessage, error)) {
	session, err := contracts.ReadRegisterPalletRuntimeSessionResponse(kept)
	if err != nil {
		outcome(nil, contracts.RelayUpstreamDetached.Refuse("the relay has no Cloudly session"))
		return
	}
	if err := r.bindNode(p, session); err != nil {
		outcome(nil, err)
		return
	}
	r.metrics.rebound.Inc()
	r.down.log.Info().Str("node", session.NodeID).Str("outcome", "rebound").Msg("node bound again to its session while detached")
	outcome(kept, nil)
}

// registerVia serves a registration a part judges and forwards (the method table's role): the
// relay admits it, and makes p a peer of role ro when the part answers it accepted. An ingress
// registration the relay refuses itself is refused in the seeds' shape (ingressrefusal.go).
func (r *Relay) registerVia(f feature.DownstreamServer, ro role, p *peer, req *typedsocket.Request) {
	refusal := func(err error) error { return err }
	if ro == roleIngress {
		refusal = r.ingressRefusal
		if err := r.ingressNotReady(); err != nil {
			r.answer(req, nil, err)
			return
		}
	}
	_, end, err := r.down.admit(p, ro, len(req.Body))
	if err != nil {
		r.answer(req, nil, refusal(err))
		return
	}
	f.ServeDownstream(req.Method, p, takeBody(req), func(body json.RawMessage, err error) {
		if err == nil {
			r.down.registered(p, ro)
		}
		end() // before the answer is queued, as registerNode's
		r.answer(req, body, refusal(err))
	})
}

// bindNode binds p to its node session (downstream.bind), then tells the parts that hear it. One
// that keeps p follows its end through p.Context(), so a connection that ends meanwhile is never
// kept as a carrier.
func (r *Relay) bindNode(p *peer, s contracts.RuntimeSession) error {
	if err := r.down.bind(p, s); err != nil {
		return err
	}
	for _, w := range r.parts.nodeBound {
		w.NodeBound(p)
	}
	return nil
}
