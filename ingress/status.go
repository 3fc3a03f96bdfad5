package ingress

import (
	"slices"
	"time"
)

// The ingress's facts for the operator's status page (relay.Reporter): connections and the route
// table's revision, size and age. Never the table itself (it carries certificates and keys), a
// bearer or a registration.

// statusRows bounds the nodes Status lists.
const statusRows = 100

// Status is what the ingress reports on the status page.
type Status struct {
	Connections int `json:"connections"` // downstream connections that are accepted ingress connections
	Registering int `json:"registering"` // connections with a registration waiting for Cloudly's answer
	// Nodes are the nodes whose ingress is connected, in order, at most 100.
	Nodes      []string         `json:"nodes"`
	RouteTable RouteTableStatus `json:"routeTable"`
}

// RouteTableStatus describes the route table held, not its contents.
type RouteTableStatus struct {
	Revision int64 `json:"revision"` // -1 while Cloudly has computed none (null)
	Derived  bool  `json:"derived"`  // the table stated no revision: it is derived from its bytes
	Bytes    int   `json:"bytes"`    // its size; 0 while null
	// ReceivedAt is when it arrived and replaced the table held before; null while none is held.
	ReceivedAt *time.Time `json:"receivedAt"`
	AgeSeconds *int64     `json:"ageSeconds"` // seconds since ReceivedAt; null while none is held
}

// Status reports the ingress connections and the route table held.
func (s *Server) Status() any {
	st := Status{RouteTable: RouteTableStatus{Revision: -1}}
	s.mu.RLock()
	st.Connections, st.Registering = len(s.byPeer), len(s.pending)
	st.Nodes = make([]string, 0, min(len(s.byNode), statusRows))
	for n := range s.byNode {
		st.Nodes = append(st.Nodes, n)
	}
	s.mu.RUnlock()
	slices.Sort(st.Nodes)
	st.Nodes = st.Nodes[:min(len(st.Nodes), statusRows)]

	if h := s.held.Load(); !h.table.IsNull() {
		at := h.at.UTC()
		age := int64(time.Since(h.at) / time.Second)
		st.RouteTable = RouteTableStatus{Revision: h.table.Revision, Derived: h.table.Derived, Bytes: len(h.table.Raw),
			ReceivedAt: &at, AgeSeconds: &age}
	}
	return st
}
