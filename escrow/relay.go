package escrow

import (
	"encoding/json"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// The escrow as the relay sees it (package feature): it serves the hold, uses the upstream to
// tell a hold from the attached Cloudly session, hears attach, detach, custody, node bindings and
// whether the relay leads, keeps what detached re-binding needs (rebind.go), is copied to HA
// standbys (replica.go), and runs beside the relay. It follows a node connection's end through
// its context, so it does not listen for connections that end.

// Methods: holdRuntimeNetworkDnsLeaseRenewals, from Cloudly, and from downstream peers only to
// refuse it by name (escrow-cloudly-only).
func (e *Escrow) Methods() (fromCloudly, fromDownstream []string) {
	hold := []string{contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals}
	return hold, hold
}

// UseUpstream keeps the relay's Cloudly session: a hold is taken only while it is attached.
func (e *Escrow) UseUpstream(up feature.Upstream) { e.up = up }

// UseReplicaSync hands the escrow the HA leader's acknowledgement from its standbys: a hold (or a
// withdrawal) is answered once every standby with a complete copy has it (docs/ha.md). Call it
// before anything runs; without it, a hold is answered at once.
func (e *Escrow) UseReplicaSync(s feature.ReplicaSync) { e.replicas = s }

// ServeCloudly serves a hold; one that comes before Cloudly accepted the relay's registration
// on this session is refused escrow-cloudly-only. With HA, the answer waits for the standbys'
// acknowledgement (bounded by the elector), on their goroutine: never on Cloudly's read loop. A
// refusal changes nothing, and is answered at once.
func (e *Escrow) ServeCloudly(_ string, body json.RawMessage, reply feature.Reply) {
	resp, err := e.Hold(e.up != nil && e.up.Attached(), body)
	if err != nil || e.replicas == nil {
		reply(resp, err)
		return
	}
	e.replicas.Sync(func(bool) { reply(resp, nil) })
}

// ServeDownstream refuses a hold from a node or the ingress (escrow-cloudly-only).
func (e *Escrow) ServeDownstream(_ string, _ feature.Peer, body json.RawMessage, reply feature.Reply) {
	reply(e.Hold(false, body))
}

// UseTenure keeps the relay's tenure: every push of a release asks it first.
func (e *Escrow) UseTenure(t feature.Tenure) { e.tenure = t }

// Attached: nothing is released while the relay is attached.
func (e *Escrow) Attached(feature.Upstream) { e.setAttached(true) }

// Detached: renewals are released from now on, each on its slot.
func (e *Escrow) Detached() { e.setAttached(false) }

// Leading: an HA standby, or a leader that lost its Lease, releases nothing (docs/ha.md); it keeps
// what it holds, for when it leads.
func (e *Escrow) Leading(leading bool) {
	now := e.nowMs()
	e.mu.Lock()
	e.sched.setStandby(!leading, now)
	e.changedLocked()
	e.mu.Unlock()
}

// Ready: the escrow holds and releases whenever it runs.
func (e *Escrow) Ready() error { return nil }
