package ingress

import (
	"encoding/json"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// The ingress as the relay sees it (package feature): it serves the route table push and the
// statistics from Cloudly, the registration and the route table to downstream peers, and hears
// the Cloudly session of each attach and the connections that end. registerClusterIngress decides
// what a connection carries (the relay's method table says so), so the relay admits it and makes
// the connection an ingress once it is answered accepted; judging it and forwarding it to Cloudly
// is Register's.

// Methods: the route table push and the statistics from Cloudly; the registration, the route
// table and (to refuse it by name) the statistics from downstream peers.
func (s *Server) Methods() (fromCloudly, fromDownstream []string) {
	return []string{contracts.MethodPushClusterRouteTable, contracts.MethodGetClusterTrafficStatistics},
		[]string{contracts.MethodRegisterClusterIngress, contracts.MethodGetClusterIngressRouteTable, contracts.MethodGetClusterTrafficStatistics}
}

// ServeCloudly serves pushClusterRouteTable and getClusterTrafficStatistics.
func (s *Server) ServeCloudly(method string, body json.RawMessage, reply feature.Reply) {
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
func (s *Server) ServeDownstream(method string, p feature.Peer, body json.RawMessage, reply feature.Reply) {
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
