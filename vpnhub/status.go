package vpnhub

// The hub's facts for the operator's status page (relay.Reporter): never a key, a member's
// address or a packet. Its counts (drops, closes, handshakes) are its Prometheus counters, which
// the status page lists itself.

// Status is what the hub reports on the status page.
type Status struct {
	Generation int64 `json:"generation"` // membership generation held; -1 while none was pushed
	Members    int   `json:"members"`    // members in that membership
	Sessions   int   `json:"sessions"`   // members connected now
	Serving    bool  `json:"serving"`    // the hub's relay leads: it serves that membership (an HA standby holds it unserved)
}

// Status reports the membership held and the sessions.
func (h *Hub) Status() any {
	st := Status{Generation: -1, Serving: !h.standby.Load()}
	if v := h.view.Load(); v != nil {
		st.Generation, st.Members = v.generation, len(v.byKey)
	}
	h.mu.Lock()
	st.Sessions = len(h.sessions)
	h.mu.Unlock()
	return st
}
