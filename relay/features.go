package relay

import (
	"context"
	"encoding/json"
	"net/http"

	"code.foss.global/serve.zone/relay/contracts"
)

// The seams between the relay core and its optional parts. Each feature package (escrow, ingress,
// restore, vpnhub, registry) implements them with standard and contracts types only, so that no
// feature package imports the relay or another feature; cmd/relay wires them together.
//
// A feature is at least a Feature: it lists the methods it serves and serves them. It may also be
// an Observer (it hears what happens to the relay's Cloudly session and its connections) and a
// Component (the relay runs it beside itself and asks it for /readyz). The relay finds out which,
// once, at New, and keeps the lists: dispatch.go's tables, its observers, its components.
//
// Replies: every reply func is called exactly once, from any goroutine, and must not block. An
// error given to a reply is sent to the caller as is: a *contracts.Refusal travels as
// "<name>: <reason>", a *contracts.ProtocolRefusal as the protocol refusal, and an error a Peer or
// Upstream call returned (the remote peer's own error) untouched.

// Features are the relay's optional parts; a nil field is off.
type Features struct {
	Escrow  Feature // holdRuntimeNetworkDnsLeaseRenewals and release while detached (SPEC §6)
	Ingress Feature // the cluster ingress: registrations, route table, statistics (SPEC §8)
	Restore Feature // isolated restore through node Corestores (SPEC §9)
	Hub     Feature // the managed VPN hub's membership (SPEC §7); its endpoint is Options.VPNHub
	// Registry serves /v2/ on the downstream listener (SPEC §10); it is run like the others when it
	// is a Component.
	Registry http.Handler
}

// Feature serves the methods it lists. Methods is read once, at New: fromCloudly are methods
// Cloudly calls on the relay (each must be one contracts.IsServedToCloudly names), fromDownstream
// methods a node or the ingress calls on the relay. The relay calls ServeCloudly only with a
// method of the first list and ServeDownstream only with one of the second; a method two features
// list, or one the relay serves itself, makes New fail. Both run on the caller's read loop: they
// must not block (start a goroutine for slow work, as restore does).
//
// attached is true when the request came on the Cloudly session whose registration Cloudly
// accepted (escrow refuses a hold from anywhere else, escrow-cloudly-only).
type Feature interface {
	Methods() (fromCloudly, fromDownstream []string)
	ServeCloudly(method string, attached bool, body json.RawMessage, reply func(json.RawMessage, error))
	ServeDownstream(method string, p Peer, body json.RawMessage, reply func(json.RawMessage, error))
}

// Observer hears what happens to the relay. Every call is short and never blocks; none is made
// with a relay lock held.
//
//   - Attached: Cloudly accepted the relay's registration; up is the session (features call
//     Cloudly through it). Detached: that session was lost (or closed for shutdown).
//   - CustodyEnded: Cloudly named an undispatched refusal (SPEC §4.4), or pushed relay: null.
//   - Configured: Cloudly pushed the relay configuration (SPEC §4.1); the newest replaces the rest.
//   - NodeBound: a connection was bound, or bound again (a rotation), to a node session. The
//     connection's end is n.Context()'s: a feature that keeps n follows it (context.AfterFunc).
//   - PeerGone: a downstream connection ended, whatever it carried.
type Observer interface {
	Attached(up Upstream)
	Detached()
	CustodyEnded()
	Configured(cfg contracts.ClusterRelayConfig)
	NodeBound(n Node)
	PeerGone(p Peer)
}

// Component is a part the relay runs beside itself. Serve starts Run and stops it (ends its ctx)
// after the downstream connections and the Cloudly session are closed, and returns once every Run
// has; a Run that fails before then stops the relay with its error. Ready says why the component
// cannot serve now (nil: it can); /readyz reports it.
type Component interface {
	Run(ctx context.Context) error
	Ready() error
}

// Reporter is a part with facts for the operator's status page (/status, /status.json): Status
// returns a value encoding/json can marshal — counts, states, times, and at most 100 rows of any
// list — built from counters the part keeps anyway, cheap enough to build on every page load. It
// never holds a secret or a body: no bearer, JWT, grant, key, route table or request body.
type Reporter interface {
	Status() any
}

// Peer, Node and Upstream are aliases of interface literals rather than named types, so that a
// feature package can declare the same literal under its own name and implement Feature and
// Observer without importing the relay: interface types with one method set are identical, named
// ones are not.

// Peer is one downstream connection as a feature sees it.
//
//   - ID is unique per connection for the life of the process.
//   - Call sends a request to the peer; done gets its answer body or an error: the peer's own
//     error, or a refusal (relay-node-busy when its send queue is full, relay-node-not-carried
//     when the connection is gone, relay-call-timeout).
type Peer = interface {
	ID() uint64
	Call(method string, body json.RawMessage, done func(json.RawMessage, error))
}

// Node is a downstream connection bound to a node session. Session is the binding Cloudly
// answered the node's latest accepted registration with; Context ends when the connection does.
type Node = interface {
	ID() uint64
	Call(method string, body json.RawMessage, done func(json.RawMessage, error))
	Session() contracts.RuntimeSession
	Context() context.Context
}

// Upstream is the relay's Cloudly session as a feature sees it.
//
//   - Attached reports whether the relay has an accepted registration with Cloudly now.
//   - Call sends a request to Cloudly; done gets Cloudly's answer or error untouched, or a
//     refusal (relay-upstream-detached, relay-upstream-busy, relay-call-timeout).
type Upstream = interface {
	Attached() bool
	Call(method string, body json.RawMessage, done func(json.RawMessage, error))
}

// part is one enabled feature as the relay holds it.
type part struct {
	name      string
	feature   Feature   // nil for the registry
	observer  Observer  // nil when it observes nothing
	component Component // nil when the relay does not run it
	reporter  Reporter  // nil when it reports nothing to the status page
}

// partsOf lists the enabled features, in a fixed order, with what each of them is.
func partsOf(f Features) []part {
	var parts []part
	add := func(name string, v any, feature Feature) {
		p := part{name: name, feature: feature}
		p.observer, _ = v.(Observer)
		p.component, _ = v.(Component)
		p.reporter, _ = v.(Reporter)
		parts = append(parts, p)
	}
	for _, f := range []struct {
		name string
		f    Feature
	}{{"escrow", f.Escrow}, {"ingress", f.Ingress}, {"restore", f.Restore}, {"vpnhub", f.Hub}} {
		if f.f != nil {
			add(f.name, f.f, f.f)
		}
	}
	if f.Registry != nil {
		add("registry", f.Registry, nil)
	}
	return parts
}
