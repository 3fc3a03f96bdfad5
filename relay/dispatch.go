package relay

import (
	"encoding/json"
	"fmt"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// The dispatch tables: which handler serves a request, by its method, for each side a request can
// come from. They are built once, at New, from the relay's own methods and every enabled
// feature's Methods, and only read after. A method outside them is forwarded — Cloudly's to the
// node it names, a node's to Cloudly — unless the relay refuses it by name (fallbacks below).
type dispatch struct {
	fromCloudly    map[string]cloudlyHandler
	fromDownstream map[string]downstreamHandler
}

// cloudlyHandler serves one of Cloudly's requests; attached is true when it came on the session
// whose registration Cloudly accepted.
type cloudlyHandler func(req *typedsocket.Request, attached bool)

// downstreamHandler serves one request of a downstream connection.
type downstreamHandler func(p *peer, req *typedsocket.Request)

// registrationRoles are the registrations a feature serves that decide what a connection carries.
// A registration is relay-core business whoever judges and forwards it: the relay admits it
// against the memory budget (beginRegistration) and gives the connection its role once it is
// accepted (registerVia). The node registration is the relay's own altogether (registerNode).
var registrationRoles = map[string]role{
	contracts.MethodRegisterClusterIngress: roleIngress,
}

// newDispatch builds the tables. It fails on a method two parts serve, and on a Cloudly method
// contracts does not name as served: Cloudly's request for it would be answered here instead of
// reaching its node.
func (r *Relay) newDispatch(parts []part) (dispatch, error) {
	d := dispatch{
		fromCloudly: map[string]cloudlyHandler{
			contracts.MethodPushClusterRelayConfig: func(req *typedsocket.Request, _ bool) {
				body, err := r.pushConfig(req.Body)
				r.answer(req, body, err)
			},
		},
		fromDownstream: map[string]downstreamHandler{
			contracts.MethodRegisterPalletRuntimeSession: r.registerNode,
		},
	}
	for _, pt := range parts {
		if pt.feature == nil {
			continue
		}
		f := pt.feature
		fromCloudly, fromDownstream := f.Methods()
		for _, m := range fromCloudly {
			if !contracts.IsServedToCloudly(m) {
				return dispatch{}, fmt.Errorf("relay: %s serves %s from Cloudly, which contracts does not name as served to Cloudly", pt.name, m)
			}
			if d.fromCloudly[m] != nil {
				return dispatch{}, fmt.Errorf("relay: %s serves %s from Cloudly, which is served already", pt.name, m)
			}
			d.fromCloudly[m] = func(req *typedsocket.Request, attached bool) {
				f.ServeCloudly(req.Method, attached, takeBody(req), r.replier(req))
			}
		}
		for _, m := range fromDownstream {
			if d.fromDownstream[m] != nil {
				return dispatch{}, fmt.Errorf("relay: %s serves %s from downstream peers, which is served already", pt.name, m)
			}
			if ro, ok := registrationRoles[m]; ok {
				d.fromDownstream[m] = func(p *peer, req *typedsocket.Request) { r.registerVia(f, ro, p, req) }
				continue
			}
			d.fromDownstream[m] = func(p *peer, req *typedsocket.Request) {
				f.ServeDownstream(req.Method, p, takeBody(req), r.replier(req))
			}
		}
	}
	return d, nil
}

// replier is the reply func a feature answers req with.
func (r *Relay) replier(req *typedsocket.Request) func(json.RawMessage, error) {
	return func(body json.RawMessage, err error) { r.answer(req, body, err) }
}

// serveCloudly dispatches one of Cloudly's requests: the table, then the refusals for methods the
// relay serves with that part off and for local-only methods, then routing to the node it names.
func (r *Relay) serveCloudly(req *typedsocket.Request, attached bool) {
	if h := r.dispatch.fromCloudly[req.Method]; h != nil {
		h(req, attached)
		return
	}
	switch m := req.Method; {
	case m == contracts.MethodPushClusterVpnMembership:
		r.answer(req, nil, contracts.RelayVPNHubOff.Refuse("this relay runs no VPN hub"))
	case contracts.IsServedToCloudly(m):
		r.answer(req, nil, contracts.RelayMethodUnknown.Refuse("%s (this relay has that part off)", m))
	case contracts.IsLocalOnlyMethod(m):
		r.answer(req, nil, contracts.RelayMethodLocalOnly.Refuse("%s belongs to a controller on the node's own host", m))
	default:
		r.routeToNode(req)
	}
}

// servePeer dispatches one request of a downstream connection: the table, then the refusals for
// local-only methods and for the methods that are Cloudly's or the relay's own, then forwarding to
// Cloudly.
func (r *Relay) servePeer(p *peer, req *typedsocket.Request) {
	if h := r.dispatch.fromDownstream[req.Method]; h != nil {
		h(p, req)
		return
	}
	switch m := req.Method; {
	case contracts.IsLocalOnlyMethod(m):
		r.answer(req, nil, contracts.RelayMethodLocalOnly.Refuse("%s belongs to a controller on the node's own host", m))
	case contracts.IsServedToCloudly(m) || contracts.IsRelayCallToCloudly(m) || m == contracts.MethodPushRelayUpstreamChanged ||
		m == contracts.MethodRegisterClusterIngress || m == contracts.MethodGetClusterIngressRouteTable:
		r.answer(req, nil, contracts.RelayMethodUnknown.Refuse("%s is not served to this connection", m))
	default:
		r.forwardToCloudly(p, req)
	}
}
