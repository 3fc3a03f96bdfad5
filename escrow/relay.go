package escrow

import (
	"encoding/json"

	"code.foss.global/serve.zone/relay/contracts"
)

// The escrow as the relay sees it: relay.Feature (the method it serves), relay.Observer (the
// upstream state, custody, node bindings) and relay.Component (Run, Ready). The relay finds these
// by their method sets; this package does not import it.

// Peer and Upstream are the relay's aliases of the same names: a downstream connection and the
// Cloudly session. The escrow uses neither.
type (
	Peer = interface {
		ID() uint64
		Call(method string, body json.RawMessage, done func(json.RawMessage, error))
	}
	Upstream = interface {
		Attached() bool
		Call(method string, body json.RawMessage, done func(json.RawMessage, error))
	}
)

// Methods: holdRuntimeNetworkDnsLeaseRenewals, from Cloudly, and from downstream peers only to
// refuse it by name (escrow-cloudly-only).
func (e *Escrow) Methods() (fromCloudly, fromDownstream []string) {
	hold := []string{contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals}
	return hold, hold
}

// ServeCloudly serves a hold; attached says it came on the Cloudly session whose registration
// was accepted, the only one a hold is taken from.
func (e *Escrow) ServeCloudly(_ string, attached bool, body json.RawMessage, reply func(json.RawMessage, error)) {
	reply(e.Hold(attached, body))
}

// ServeDownstream refuses a hold from a node or the ingress (escrow-cloudly-only).
func (e *Escrow) ServeDownstream(_ string, _ Peer, body json.RawMessage, reply func(json.RawMessage, error)) {
	reply(e.Hold(false, body))
}

// Attached: nothing is released while the relay is attached.
func (e *Escrow) Attached(Upstream) { e.setAttached(true) }

// Detached: renewals are released from now on, each on its slot.
func (e *Escrow) Detached() { e.setAttached(false) }

// Configured changes nothing for the escrow.
func (e *Escrow) Configured(contracts.ClusterRelayConfig) {}

// PeerGone changes nothing: the escrow follows a node connection's end through its context.
func (e *Escrow) PeerGone(Peer) {}

// Ready: the escrow holds and releases whenever it runs.
func (e *Escrow) Ready() error { return nil }
