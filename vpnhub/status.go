package vpnhub

// The hub's facts for the operator's status page (relay.Reporter): counts by name only, never a
// key, a member's address or a packet.

// Status is what the hub reports on the status page.
type Status struct {
	Generation int64 `json:"generation"` // membership generation held; -1 while none was pushed
	Members    int   `json:"members"`    // members in that membership
	Sessions   int   `json:"sessions"`   // members connected now
	// Drops counts packets the data plane dropped, by reason (malformed, unauthenticated,
	// replayed, spoofed, not-unicast, unknown-destination, expired, too-large, queue-full).
	Drops map[string]int64 `json:"drops"`
	// Closes counts sessions ended, by reason: a refusal name, left or shutdown.
	Closes map[string]int64 `json:"closes"`
	// Handshakes counts handshakes by outcome: accepted, a refusal name, rate-limited or broken.
	Handshakes map[string]int64 `json:"handshakes"`
}

// Status reports the membership held, the sessions and the drop, close and handshake counts.
func (h *Hub) Status() any {
	st := Status{Generation: -1, Drops: make(map[string]int64, dropReasons-1),
		Closes: h.m.closeCounts.Snapshot(), Handshakes: h.m.handshakeCounts.Snapshot()}
	if v := h.view.Load(); v != nil {
		st.Generation, st.Members = v.generation, len(v.byKey)
	}
	h.mu.Lock()
	st.Sessions = len(h.sessions)
	h.mu.Unlock()
	for r := dropNone + 1; r < dropReasons; r++ {
		st.Drops[r.String()] = h.m.dropCounts[r].Load()
	}
	return st
}
