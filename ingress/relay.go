package ingress

import (
	"context"
	"encoding/json"

	"code.foss.global/serve.zone/relay/contracts"
)

// The ingress as the relay sees it: relay.Feature (the methods it serves) and relay.Observer (the
// Cloudly session of the latest attach, connections that end). The relay finds these by their
// method sets; this package does not import it. registerClusterIngress decides what a connection
// carries, so the relay admits it and makes the connection an ingress once it is answered
// accepted; judging it and forwarding it to Cloudly is Register's.

// Node is the relay's alias of the same name: a connection bound to a node session. The ingress
// keeps none.
type Node = interface {
	ID() uint64
	Call(method string, body json.RawMessage, done func(json.RawMessage, error))
	Session() contracts.RuntimeSession
	Context() context.Context
}

// Methods: the route table push and the statistics from Cloudly; the registration, the route
// table and (to refuse it by name) the statistics from downstream peers.
func (s *Server) Methods() (fromCloudly, fromDownstream []string) {
	return []string{contracts.MethodPushClusterRouteTable, contracts.MethodGetClusterTrafficStatistics},
		[]string{contracts.MethodRegisterClusterIngress, contracts.MethodGetClusterIngressRouteTable, contracts.MethodGetClusterTrafficStatistics}
}

// ServeCloudly serves pushClusterRouteTable and getClusterTrafficStatistics.
func (s *Server) ServeCloudly(method string, _ bool, body json.RawMessage, reply func(json.RawMessage, error)) {
	switch method {
	case contracts.MethodPushClusterRouteTable:
		reply(s.PushRouteTable(body))
	case contracts.MethodGetClusterTrafficStatistics:
		s.TrafficStatistics(body, reply)
	default:
		reply(nil, contracts.RelayMethodUnknown.Refuse("%s is not the ingress's", method))
	}
}

// ServeDownstream serves registerClusterIngress and getClusterIngressRouteTable, and refuses
// getClusterTrafficStatistics: it is Cloudly's to ask, of the ingress (relay-ingress-only).
func (s *Server) ServeDownstream(method string, p Peer, body json.RawMessage, reply func(json.RawMessage, error)) {
	switch method {
	case contracts.MethodRegisterClusterIngress:
		s.Register(p, body, reply)
	case contracts.MethodGetClusterIngressRouteTable:
		reply(s.RouteTable(p, body))
	case contracts.MethodGetClusterTrafficStatistics:
		reply(nil, contracts.RelayIngressOnly.Refuse("%s is Cloudly's to ask, of the cluster ingress", method))
	default:
		reply(nil, contracts.RelayMethodUnknown.Refuse("%s is not the ingress's", method))
	}
}

// Detached changes nothing: the ingress keeps serving the table it holds, and a registration is
// refused relay-upstream-detached by the session itself.
func (s *Server) Detached() {}

// CustodyEnded changes nothing: custody is about nodes' escrowed runs.
func (s *Server) CustodyEnded() {}

// Configured changes nothing for the ingress.
func (s *Server) Configured(contracts.ClusterRelayConfig) {}

// NodeBound changes nothing: a node connection is no ingress.
func (s *Server) NodeBound(Node) {}
