package relay

import "code.foss.global/serve.zone/relay/contracts"

// The method table: every method the relay may serve itself, with the sides it is served from,
// the refusal when no part serves it, and whether an accepted answer decides what the connection
// carries. Dispatch reads it and nothing else about features: a part lists what it serves
// (feature.Server), and a method outside this table is forwarded — Cloudly's to the node it
// names, a node's to Cloudly — unless it is local-only or one of the relay's own calls.
//
// Adding a method a part serves is one row here, its constant in contracts and the part's own
// code; a forwarded method needs nothing at all.

// side is where a request comes from.
type side uint8

const (
	fromCloudly side = 1 << iota
	fromDownstream
)

// rule is what the relay does with one method of the table.
type rule struct {
	from side // the sides it is served from; from any other side it is refused relay-method-unknown
	// off answers it when no enabled part serves it (relay-method-unknown when empty).
	off contracts.RefusalName
	// role, on a downstream registration, is what the connection carries once it is accepted:
	// the relay admits such a registration against its bounds and gives the connection its role,
	// whoever judges and forwards it.
	role role
	// relay marks a method the core serves itself, never a part.
	relay bool
}

var methodTable = map[string]rule{
	contracts.MethodPushClusterRelayConfig:             {from: fromCloudly, relay: true},
	contracts.MethodRegisterPalletRuntimeSession:       {from: fromDownstream, role: roleNode, relay: true},
	contracts.MethodPushClusterVpnMembership:           {from: fromCloudly, off: contracts.RelayVPNHubOff},
	contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals: {from: fromCloudly | fromDownstream}, // escrow refuses a node's by name
	contracts.MethodPushClusterRouteTable:              {from: fromCloudly},
	contracts.MethodGetClusterTrafficStatistics:        {from: fromCloudly | fromDownstream}, // the ingress refuses a node's by name
	contracts.MethodRegisterClusterIngress:             {from: fromDownstream, role: roleIngress},
	contracts.MethodGetClusterIngressRouteTable:        {from: fromDownstream},
	contracts.MethodPrepareIsolatedRestoreOnNode:       {from: fromCloudly},
	contracts.MethodStageIsolatedRestoreArchive:        {from: fromCloudly},
	contracts.MethodGetIsolatedRestoreProgressOnNode:   {from: fromCloudly},
	contracts.MethodExecuteIsolatedRestoreOnNode:       {from: fromCloudly},
	contracts.MethodCleanupIsolatedRestoreOnNode:       {from: fromCloudly},
	contracts.MethodPushCorestoreCredential:            {from: fromCloudly}, // the platform agent's
}

// ruleFor is m's row, and whether it has one.
func ruleFor(m string) (rule, bool) {
	r, ok := methodTable[m]
	return r, ok
}

// offRefusal is the answer to a method of the table that no enabled part serves from s.
func (r rule) offRefusal(m string, s side) error {
	switch {
	case r.from&s == 0:
		return contracts.RelayMethodUnknown.Refuse("%s is not served to this connection", m)
	case r.off != "":
		return r.off.Refuse("this relay has that part off (%s)", m)
	}
	return contracts.RelayMethodUnknown.Refuse("%s (this relay has that part off)", m)
}
