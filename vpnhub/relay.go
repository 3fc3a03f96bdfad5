package vpnhub

import (
	"encoding/json"
	"errors"

	"code.foss.global/serve.zone/relay/contracts"
)

// The hub as the relay sees it: relay.Feature (pushClusterVpnMembership) and relay.Component
// (Run, Ready). The relay finds these by their method sets; this package does not import it. The
// hub's endpoint (Endpoint) is configuration the relay is given, not a call it makes.

// Peer is the relay's alias of the same name: a downstream connection. The hub serves none.
type Peer = interface {
	ID() uint64
	Call(method string, body json.RawMessage, done func(json.RawMessage, error))
}

// Methods: pushClusterVpnMembership, from Cloudly only.
func (h *Hub) Methods() (fromCloudly, fromDownstream []string) {
	return []string{contracts.MethodPushClusterVpnMembership}, nil
}

// ServeCloudly serves pushClusterVpnMembership (PushMembership).
func (h *Hub) ServeCloudly(_ string, _ bool, body json.RawMessage, reply func(json.RawMessage, error)) {
	reply(h.PushMembership(body))
}

// ServeDownstream: the hub serves nothing to downstream peers.
func (h *Hub) ServeDownstream(method string, _ Peer, _ json.RawMessage, reply func(json.RawMessage, error)) {
	reply(nil, contracts.RelayMethodUnknown.Refuse("%s is not served to this connection", method))
}

// Ready is an error once Run has stopped the hub.
func (h *Hub) Ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return errors.New("stopped")
	}
	return nil
}
