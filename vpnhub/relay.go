package vpnhub

import (
	"encoding/json"
	"errors"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// The hub as the relay sees it (package feature): it serves pushClusterVpnMembership from Cloudly
// and runs beside the relay. The hub's endpoint (Endpoint) is configuration the relay is given,
// not a call it makes.

// Methods: pushClusterVpnMembership, from Cloudly only.
func (h *Hub) Methods() (fromCloudly, fromDownstream []string) {
	return []string{contracts.MethodPushClusterVpnMembership}, nil
}

// ServeCloudly serves pushClusterVpnMembership (PushMembership).
func (h *Hub) ServeCloudly(_ string, body json.RawMessage, reply feature.Reply) {
	reply(h.PushMembership(body))
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
