package restore

import (
	"cmp"
	"slices"
	"strings"
)

// The restore's facts for the operator's status page (relay.Reporter): calls in flight and how
// calls ended, by node and refusal name. Never a control, a grant, an origin or an answer.

// statusRows bounds the nodes Status lists.
const statusRows = 100

// Status is what the restore reports on the status page.
type Status struct {
	Inflight           int `json:"inflight"`           // calls waiting for a Corestore's answer
	MaxInflight        int `json:"maxInflight"`        // the bound on them
	MaxInflightPerNode int `json:"maxInflightPerNode"` // the bound per node
	Corestores         int `json:"corestores"`         // nodes whose Corestore origin the newest configuration names
	// Nodes lists the nodes with calls in flight, the most first (then by node id), at most 100.
	// Calls answered and refused are relay_restore_requests_total, which the status page lists.
	Nodes []StatusNode `json:"nodes"`
}

// StatusNode is one node's calls in flight.
type StatusNode struct {
	Node     string `json:"node"`
	Inflight int    `json:"inflight"`
}

// Status reports the calls in flight.
func (r *Restore) Status() any {
	st := Status{MaxInflight: r.opts.MaxInflight, MaxInflightPerNode: r.opts.MaxInflightPerNode}
	r.mu.Lock()
	st.Inflight, st.Corestores = r.total, len(r.origins)
	st.Nodes = make([]StatusNode, 0, len(r.inflight))
	for n, k := range r.inflight {
		st.Nodes = append(st.Nodes, StatusNode{Node: n, Inflight: k})
	}
	r.mu.Unlock()
	slices.SortFunc(st.Nodes, func(a, b StatusNode) int {
		return cmp.Or(cmp.Compare(b.Inflight, a.Inflight), strings.Compare(a.Node, b.Node))
	})
	st.Nodes = st.Nodes[:min(len(st.Nodes), statusRows)]
	return st
}
