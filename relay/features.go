package relay

import (
	"context"
	"encoding/json"
	"net/http"

	"code.foss.global/serve.zone/relay/contracts"
)

// The small interfaces the relay dispatches to. Each feature package (escrow, ingress, restore,
// vpnhub) implements one with standard and contracts types only, so that no feature package
// imports the relay or another feature; cmd/relay wires them together. A nil feature is off.
//
// Replies: every asynchronous reply func is called exactly once, from any goroutine, and must not
// block. An error given to a reply is sent to the caller as is: a *contracts.Refusal travels as
// "<name>: <reason>", a *contracts.ProtocolRefusal as the protocol refusal, and an error a Peer
// or Upstream call returned (the remote peer's own error) untouched.

// Features are the relay's optional parts. A feature that is an io.Closer is closed when the
// relay has shut its connections down.
type Features struct {
	Escrow   Escrow
	Ingress  Ingress
	Restore  Restore
	Hub      VPNHub
	Registry http.Handler // serves /v2/ on the downstream listener
}

// Peer, Node and Upstream are aliases of interface literals rather than named types, so that a
// feature package can declare the same literal and implement Escrow or Ingress with its own
// names: interface types with one method set are identical, named ones are not.

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
// answered the node's latest accepted registration with.
type Node = interface {
	ID() uint64
	Call(method string, body json.RawMessage, done func(json.RawMessage, error))
	Session() contracts.RuntimeSession
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

// Escrow holds DNS lease renewal runs and releases them while the relay is detached (SPEC §6).
type Escrow interface {
	// Hold serves holdRuntimeNetworkDnsLeaseRenewals. fromCloudly is false when the request did
	// not come on the attached Cloudly session.
	Hold(fromCloudly bool, body json.RawMessage) (json.RawMessage, error)
	// SetAttached reports the upstream state: renewals are released only while detached.
	SetAttached(attached bool)
	// EndCustody drops every run: Cloudly said it does not dispatch to this relay.
	EndCustody()
	// NodeBound is called when a node connection is bound or re-bound to a session; NodeGone
	// when that connection ends.
	NodeBound(n Node)
	NodeGone(n Node)
	// Run drives releases until ctx ends.
	Run(ctx context.Context)
}

// Ingress serves the cluster ingress (SPEC §8).
type Ingress interface {
	// Register serves registerClusterIngress from p, forwarding it to Cloudly.
	Register(p Peer, body json.RawMessage, reply func(json.RawMessage, error))
	// IsIngress reports whether Cloudly accepted an ingress registration on p.
	IsIngress(p Peer) bool
	// RouteTable serves getClusterIngressRouteTable (relay-ingress-only for anyone but an
	// accepted ingress).
	RouteTable(p Peer, body json.RawMessage) (json.RawMessage, error)
	// PushRouteTable serves pushClusterRouteTable from Cloudly.
	PushRouteTable(body json.RawMessage) (json.RawMessage, error)
	// TrafficStatistics serves getClusterTrafficStatistics from Cloudly.
	TrafficStatistics(body json.RawMessage, reply func(json.RawMessage, error))
	// Attached is called after every accepted registration with Cloudly (pull the route table).
	Attached(up Upstream)
	// PeerGone is called when a downstream connection ends.
	PeerGone(p Peer)
}

// Restore carries isolated-restore controls to node Corestores (SPEC §9).
type Restore interface {
	// Serve serves one of the five isolated-restore methods from Cloudly.
	Serve(method string, body json.RawMessage, reply func(json.RawMessage, error))
	// SetCorestores replaces the Corestore origins, from pushClusterRelayConfig.
	SetCorestores(origins []contracts.CorestoreOrigin)
}

// VPNHub is the cluster's managed VPN hub (SPEC §7).
type VPNHub interface {
	// Endpoint is what registerClusterRelay reports as relay.vpnHub.
	Endpoint() contracts.VPNHubEndpoint
	// PushMembership serves pushClusterVpnMembership.
	PushMembership(body json.RawMessage) (json.RawMessage, error)
	// Run serves the hub until ctx ends, then closes every session. The hub is already bound
	// (Endpoint is final) when it is given to the relay.
	Run(ctx context.Context) error
}
