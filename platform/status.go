package platform

import (
	"slices"
	"strings"
)

// The agent's facts for the operator's status page (feature.Reporter): per node, the desired-state
// revision pulled and the one Corestore took, backups delivered, restores settled and the last
// outcomes. Never a credential, key, origin, descriptor or binding.

const statusRows = 100

// Status is what the agent reports.
type Status struct {
	Enrolled         bool         `json:"enrolled"`         // a recipient enrollment completed in the current session
	Enrollment       string       `json:"enrollment"`       // outcome of the newest enrollment ("" none yet)
	Revision         int64        `json:"revision"`         // desired states pulled and read since start
	LastPull         string       `json:"lastPull"`         // outcome of the newest pull
	Corestores       int          `json:"corestores"`       // nodes with a Corestore origin
	ClosuresInflight int          `json:"closuresInflight"` // closures being carried now
	MaxClosures      int          `json:"maxClosures"`      // the bound on them
	Nodes            []StatusNode `json:"nodes"`            // by node id, at most 100
}

// StatusNode is one node's platform facts.
type StatusNode struct {
	Node        string `json:"node"`
	Credential  bool   `json:"credential"`  // Cloudly pushed a credential for its Corestore
	Desired     int64  `json:"desired"`     // the newest revision pulled for it
	Handed      int64  `json:"handed"`      // the revision its Corestore took
	HandOver    string `json:"handOver"`    // outcome of the last hand-over
	Listing     string `json:"listing"`     // outcome of the last listing
	Delivered   int64  `json:"delivered"`   // backups delivered
	LastBackup  string `json:"lastBackup"`  // outcome of the last backup
	Settled     int64  `json:"settled"`     // restores settled
	LastRestore string `json:"lastRestore"` // outcome of the last restore
}

// Status reports the agent's facts.
func (p *Platform) Status() any {
	p.mu.Lock()
	st := Status{Enrolled: p.enrolled != 0 && p.enrolled == p.session && p.attached, Enrollment: p.enrollment,
		Revision: p.revision, LastPull: p.lastPull, Corestores: len(p.nodes), ClosuresInflight: p.slots.inflight(), MaxClosures: p.opts.MaxClosures}
	nodes := p.nodeList()
	p.mu.Unlock()
	slices.SortFunc(nodes, func(a, b *node) int { return strings.Compare(a.id, b.id) })
	st.Nodes = make([]StatusNode, 0, min(len(nodes), statusRows))
	for _, n := range nodes[:min(len(nodes), statusRows)] {
		st.Nodes = append(st.Nodes, n.status())
	}
	return st
}

func (n *node) status() StatusNode {
	n.mu.Lock()
	defer n.mu.Unlock()
	return StatusNode{Node: n.id, Credential: !n.credential.IsZero(), Desired: n.desiredRev, Handed: n.handedRev, HandOver: n.handOver,
		Listing: n.listing, Delivered: n.delivered, LastBackup: n.lastBackup, Settled: n.settled, LastRestore: n.lastRestor}
}
