package vpnhub

import (
	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// Several relays per cluster: only the elected relay's hub serves the membership. Every replica
// binds its hub and holds the membership (the leader's copy, replication in replica.go), but a
// standby's hub refuses every handshake (vpn-hub-standby) and forwards nothing; the Service
// sends members to the leader's hub anyway. The relay tells the hub whether it leads
// (feature.LeadWatcher): a relay without HA leads from the start, an HA relay stands by until
// elected and again from the moment it is fenced.

// UseTenure implements feature.TenureUser: the hub serves the membership only while the relay's
// tenure as the leader holds, so a process resumed after a stop (SIGSTOP, a frozen VM) forwards
// no packet and admits no handshake before its relay has noticed the tenure is gone and fenced.
func (h *Hub) UseTenure(t feature.Tenure) { h.tenure = t }

// serving reports whether the hub serves the membership now: its relay leads, and its tenure
// holds. It is on the packet path: two atomic loads and a monotonic clock reading.
func (h *Hub) serving() bool { return !h.standby.Load() && (h.tenure == nil || h.tenure.Held()) }

// standbyReason is what a standby's refusal says.
const standbyReason = "this relay is not the elected one of its cluster: the relay that leads serves the VPN"

func standbyRefusal() *contracts.Refusal { return contracts.VPNHubStandby.Refuse(standbyReason) }

// Leading implements feature.LeadWatcher. Told true, the hub serves the membership it holds at
// once. Told false (an HA standby, or a leader fenced), it closes every session
// (vpn-hub-standby), so that members redial through the Service to the relay that leads, and
// refuses handshakes until it leads again.
func (h *Hub) Leading(leading bool) {
	h.mu.Lock()
	if h.standby.Load() == !leading {
		h.mu.Unlock()
		return
	}
	h.standby.Store(!leading)
	var closing []*session
	if !leading {
		for _, s := range h.sessions {
			h.detachLocked(s)
			closing = append(closing, s)
		}
		h.rescheduleLocked(h.clock.Now().UnixMilli())
	}
	generation := int64(-1)
	if v := h.view.Load(); v != nil {
		generation = v.generation
	}
	h.mu.Unlock()
	for _, s := range closing {
		s.shut(contracts.VPNCloseCodeRefused, standbyRefusal(), string(contracts.VPNHubStandby))
	}
	if leading {
		h.log.Info().Int64("generation", generation).Str("outcome", "leading").Msg("vpn hub serves its membership: this relay leads")
	} else {
		h.log.Info().Int64("generation", generation).Int("closed", len(closing)).Str("outcome", "standby").
			Msg("vpn hub stands by: it serves no membership while this relay does not lead")
	}
}
