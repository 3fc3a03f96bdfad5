package relay

import (
	"encoding/json"
	"errors"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// takeBody hands over a request's body for forwarding and drops the request's hold on it: the
// request waits for its answer (up to the call timeout) and needs nothing of its body meanwhile,
// which would otherwise keep the whole frame it was read from.
func takeBody(req *typedsocket.Request) json.RawMessage {
	b := req.Body
	req.Body, req.RelayNodeRaw = nil, nil // a peer's relayNodeId is never forwarded
	return b
}

// forwardToCloudly forwards a node's request, only from a node connection, with the envelope
// stating the connection's node (relayNodeId): the upstream socket is authenticated as the relay,
// and this is how Cloudly knows the physical peer behind it. A node's own relayNodeId is never
// forwarded (the envelope is written anew).
func (r *Relay) forwardToCloudly(p *peer, req *typedsocket.Request) {
	node := p.nodeID()
	if node == "" {
		r.answer(req, nil, contracts.RelaySessionForeign.Refuse("%s from a connection with no node session; register first", req.Method))
		return
	}
	if err := judgeSession(req.Method, req.Body, node); err != nil {
		r.answer(req, nil, err)
		return
	}
	streams, err := r.bindMarkers(p, req.Body)
	if err != nil {
		r.answer(req, nil, err)
		return
	}
	if r.draining.Load() {
		r.answer(req, nil, contracts.RelayUpstreamDetached.Refuse("the relay is shutting down"))
		return
	}
	start, size := r.now(), len(req.Body)
	// Charged to the node's share until written: a node sending max-size messages holds at most
	// its share of the queue every node shares (docs/hostile.md).
	k := r.up.callFor(p.share, node, req.Method, takeBody(req), func(body json.RawMessage, err error) {
		if err == nil {
			_, err = r.bindMarkers(p, body) // a stream in Cloudly's answer flows to this node
		}
		r.forwarded("to-cloudly", err)
		p.counted(&p.toCloudly, err)
		r.logForward(req.Method, node, size, err, start)
		r.answer(req, body, err)
	})
	if streams != nil {
		r.streams.keepAlive(streams, k) // its answer may wait for the stream it carries
	}
}

// judgeSession judges the session a node's request carries: required only where the seeds require
// one (contracts.RequiresSession), and, wherever the body carries one, naming the connection's own
// node. A session the relay cannot read (not an object, a nodeId that is not a string, a repeated
// key) is refused relay-request-invalid: unread, it could name another node to Cloudly.
func judgeSession(method string, body []byte, node string) error {
	claimed, present, err := contracts.ReadSessionNodeID(body)
	switch {
	case err != nil:
		return contracts.RelayRequestInvalid.Refuse("%v", err)
	case !present && contracts.RequiresSession(method):
		return contracts.RelaySessionForeign.Refuse("%s carries no session of node %s", method, node)
	case present && claimed != node:
		return contracts.RelaySessionForeign.Refuse("%s names another node's session on node %s's connection", method, node)
	}
	return nil
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
	p := r.down.nodes.get(node)
	if r.draining.Load() {
		p = nil // the relay is shutting down: its nodes are about to be carried by no one
	}
	if p == nil {
		r.refuseCloudly(req, node, contracts.RelayNodeNotCarried.Refuse("%s", node))
		return
	}
	streams, err := r.bindMarkers(p, req.Body)
	if err != nil {
		r.refuseCloudly(req, node, err)
		return
	}
	start, size := r.now(), len(req.Body)
	k := p.call(req.Method, takeBody(req), func(body json.RawMessage, err error) {
		if err == nil {
			_, err = r.bindMarkers(p, body) // a stream in the node's answer flows from this node
		}
		r.forwarded("to-node", err)
		p.counted(&p.toNode, err)
		r.logForward(req.Method, node, size, err, start)
		// The node's answer waits on the Cloudly socket charged to the node's share, never past
		// its cap: past it, this runs on the node's read loop and waits, so the node's further
		// bytes wait on its own socket (docs/hostile.md).
		if err != nil {
			r.metrics.refused(err)
		}
		req.Answer(typedsocket.Reply{Response: body, Err: err, Charge: p.share, Wait: p.conn.Context().Done()})
	})
	if streams != nil {
		r.streams.keepAlive(streams, k)
	}
}

// refuseCloudly answers a Cloudly request the relay cannot route, and says so in the log: Cloudly
// is the one peer whose misrouted requests an operator must be able to see. Sampled, so that a
// burst cannot flood the log.
func (r *Relay) refuseCloudly(req *typedsocket.Request, node string, err error) {
	r.log.refusal.Info().Str("method", req.Method).Str("node", node).
		Str("outcome", contracts.RefusalLabel(err)).Msg("refused a Cloudly request")
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
	ev := r.down.log.Debug()
	if !ev.Enabled() {
		return
	}
	outcome := "answered"
	if err != nil {
		outcome = contracts.RefusalLabel(err)
	}
	ev.Str("outcome", outcome).Str("method", method).Str("node", node).Int("bytes", size).
		Dur("latency", r.now().Sub(start)).Msg("forwarded")
}

// announceAttached tells every node and ingress connection the relay is attached again, after
// which nodes register again themselves. A peer whose queue is full misses the hint (counted);
// it learns the state from its next request.
func (r *Relay) announceAttached() {
	body := json.RawMessage(`{"attached":true}`)
	for _, p := range r.down.carried() {
		p.Call(contracts.MethodPushRelayUpstreamChanged, body, func(_ json.RawMessage, err error) {
			if err != nil && errors.Is(err, contracts.RelayNodeBusy) {
				r.metrics.dropped.WithLabelValues("upstream-changed-queue-full").Inc()
			}
		})
	}
}
