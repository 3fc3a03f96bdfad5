package relay

import (
	"encoding/json"
	"fmt"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// The dispatch tables: which handler serves a request, by its method, for each side a request can
// come from; part of the feature table (features.go). They are built once, at New, from the method table (methods.go) and every part's
// Methods, and only read after. A method outside them is answered by its row's refusal, refused
// when it is local-only or the relay's own, or forwarded: Cloudly's to the node it names, a
// node's to Cloudly.
type dispatch struct {
	fromCloudly    map[string]cloudlyHandler
	fromDownstream map[string]downstreamHandler
}

// cloudlyHandler serves one of Cloudly's requests.
type cloudlyHandler func(req *typedsocket.Request)

// downstreamHandler serves one request of a downstream connection.
type downstreamHandler func(p *peer, req *typedsocket.Request)

// newDispatch builds the tables: the relay's own rows, then every part's methods. It fails on a
// method two parts serve, on one the relay serves itself, on one outside the method table or not
// served from the side a part lists it for, and on a part that lists methods of a side it does
// not serve.
func (r *Relay) newDispatch(list []Part) (dispatch, error) {
	d := dispatch{
		fromCloudly: map[string]cloudlyHandler{
			contracts.MethodPushClusterRelayConfig: func(req *typedsocket.Request) {
				body, err := r.pushConfig(req.Body)
				r.answer(req, body, err)
			},
		},
		fromDownstream: map[string]downstreamHandler{
			contracts.MethodRegisterPalletRuntimeSession: r.registerNode,
		},
	}
	check := func(name, m string, s side) error {
		row, ok := ruleFor(m)
		switch {
		case !ok || row.from&s == 0:
			return fmt.Errorf("relay: %s serves %s from %s, which the method table does not serve from there", name, m, s)
		case row.relay:
			return fmt.Errorf("relay: %s serves %s, which the relay serves itself", name, m)
		}
		return nil
	}
	for _, pt := range list {
		srv, ok := pt.Impl.(feature.Server)
		if !ok {
			continue
		}
		cl, dn := srv.Methods()
		cs, _ := pt.Impl.(feature.CloudlyServer)
		ds, _ := pt.Impl.(feature.DownstreamServer)
		if len(cl) > 0 && cs == nil || len(dn) > 0 && ds == nil {
			return dispatch{}, fmt.Errorf("relay: %s lists methods of a side it does not serve", pt.Name)
		}
		for _, m := range cl {
			if err := check(pt.Name, m, fromCloudly); err != nil {
				return dispatch{}, err
			}
			if d.fromCloudly[m] != nil {
				return dispatch{}, fmt.Errorf("relay: %s serves %s from Cloudly, which is served already", pt.Name, m)
			}
			d.fromCloudly[m] = func(req *typedsocket.Request) { cs.ServeCloudly(req.Method, takeBody(req), r.replier(req)) }
		}
		for _, m := range dn {
			if err := check(pt.Name, m, fromDownstream); err != nil {
				return dispatch{}, err
			}
			if d.fromDownstream[m] != nil {
				return dispatch{}, fmt.Errorf("relay: %s serves %s from downstream peers, which is served already", pt.Name, m)
			}
			if ro := methodTable[m].role; ro != roleNone {
				d.fromDownstream[m] = func(p *peer, req *typedsocket.Request) { r.registerVia(ds, ro, p, req) }
				continue
			}
			d.fromDownstream[m] = func(p *peer, req *typedsocket.Request) {
				ds.ServeDownstream(req.Method, p, takeBody(req), r.replier(req))
			}
		}
	}
	return d, nil
}

func (s side) String() string {
	if s == fromCloudly {
		return "Cloudly"
	}
	return "downstream peers"
}

// replier is the reply func a part answers req with.
func (r *Relay) replier(req *typedsocket.Request) feature.Reply {
	return func(body json.RawMessage, err error) { r.answer(req, body, err) }
}

// serveCloudly dispatches one of Cloudly's requests: the tables, then the method table's refusal
// for a method whose part is off, the refusal of local-only methods, then routing to the node it
// names.
func (r *Relay) serveCloudly(req *typedsocket.Request) {
	if h := r.parts.methods.fromCloudly[req.Method]; h != nil {
		h(req)
		return
	}
	switch row, ok := ruleFor(req.Method); {
	case ok:
		r.answer(req, nil, row.offRefusal(req.Method, fromCloudly))
	case contracts.IsLocalOnlyMethod(req.Method):
		r.answer(req, nil, contracts.RelayMethodLocalOnly.Refuse("%s belongs to a controller on the node's own host", req.Method))
	default:
		r.routeToNode(req)
	}
}

// servePeer dispatches one request of a downstream connection: the tables, then the method
// table's refusal, the refusals of local-only methods and of the relay's own calls and pushes,
// then forwarding to Cloudly.
func (r *Relay) servePeer(p *peer, req *typedsocket.Request) {
	if h := r.parts.methods.fromDownstream[req.Method]; h != nil {
		h(p, req)
		return
	}
	m := req.Method
	switch row, ok := ruleFor(m); {
	case ok:
		r.answer(req, nil, row.offRefusal(m, fromDownstream))
	case contracts.IsLocalOnlyMethod(m):
		r.answer(req, nil, contracts.RelayMethodLocalOnly.Refuse("%s belongs to a controller on the node's own host", m))
	case contracts.IsRelayCallToCloudly(m) || m == contracts.MethodPushRelayUpstreamChanged:
		r.answer(req, nil, contracts.RelayMethodUnknown.Refuse("%s is not served to this connection", m))
	default:
		r.forwardToCloudly(p, req)
	}
}
