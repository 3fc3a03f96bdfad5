package escrow

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
)

// The escrow's facts for the operator's status page (relay.Reporter). They name nodes and count;
// they never hold a renewal, a signature, a session binding or a controller.

// statusRows bounds the nodes Status lists: the ones holding the most renewals.
const statusRows = 100

// Status is what the escrow reports on the status page.
type Status struct {
	Runs     int `json:"runs"`     // nodes whose run is held
	Renewals int `json:"renewals"` // signed renewals held across every run
	// Releasing is true while the relay is detached: only then are held renewals released.
	Releasing bool `json:"releasing"`
	// NextRelease is when the next push is due, while detached; null when none is (attached, or no
	// carried node has a renewal to come). A push due now reads as now.
	NextRelease *time.Time `json:"nextRelease"`
	// ReleasesWhileDetached counts the renewals pushed to nodes since the relay started; every
	// push happens while detached.
	// The outcomes of pushes, holds and drops are the escrow's Prometheus counters, which the
	// status page lists itself (relay_escrow_releases_total, _holds_total, _runs_dropped_total).
	ReleasesWhileDetached int64 `json:"releasesWhileDetached"`
	// DigestUnverified counts the renewals held since the relay started whose well-formed digest
	// the relay's assumed rule does not reproduce (relay_escrow_digest_unverified_total): the seeds
	// require the check without spelling the preimage, so such a renewal is held and the node,
	// which verifies digest and signature, decides. DigestRule says which the relay applies:
	// "assumed" (unverified digests held) or "verified" (refused escrow-run-invalid).
	DigestUnverified int64  `json:"digestUnverified"`
	DigestRule       string `json:"digestRule"`
	// Nodes lists at most 100 nodes holding a run, the most renewals first (then by node id).
	Nodes []StatusNode `json:"nodes"`
}

// StatusNode is one node's run as the status page shows it.
type StatusNode struct {
	Node     string `json:"node"`
	Renewals int    `json:"renewals"` // renewals held in the node's run
	Carried  bool   `json:"carried"`  // the relay carries a session of the node now: a release can reach it
	// NextSlot is when the run's next renewal window opens; null when every window has opened.
	NextSlot *time.Time `json:"nextSlot"`
	// HeldUntil is when the run's last window ends: the run is dropped then.
	HeldUntil time.Time `json:"heldUntil"`
}

// Status reports the escrow's runs and release counts. Under the lock it only copies one small
// row per held run; sorting and the per-run reads (a run is immutable) happen after.
func (e *Escrow) Status() any {
	type row struct {
		id      string
		run     *heldRun
		carried bool
		at      int64 // the node's next event (heap key)
	}
	e.mu.Lock()
	attached := e.sched.attached
	renewals := e.sched.renewals
	rows := make([]row, len(e.sched.due))
	for i, ns := range e.sched.due {
		rows[i] = row{id: ns.id, run: ns.run, carried: ns.node != nil, at: ns.at}
	}
	e.mu.Unlock()

	now := e.nowMs()
	st := Status{
		Runs: len(rows), Renewals: renewals, Releasing: !attached,
		ReleasesWhileDetached: e.metrics.pushes.Load(),
		DigestUnverified:      e.metrics.unverifiedHeld.Load(), DigestRule: digestRule(),
	}
	if !attached {
		next := int64(-1)
		for _, r := range rows {
			// A node's next event is a push unless it is its run's end: nothing to release to it
			// before then (not carried, acknowledged, in flight, or out of attempts).
			if r.at < r.run.lastExpires() && (next < 0 || r.at < next) {
				next = r.at
			}
		}
		if next >= 0 {
			t := time.UnixMilli(max(next, now)).UTC()
			st.NextRelease = &t
		}
	}
	slices.SortFunc(rows, func(a, b row) int {
		return cmp.Or(cmp.Compare(len(b.run.renewals), len(a.run.renewals)), strings.Compare(a.id, b.id))
	})
	st.Nodes = make([]StatusNode, 0, min(len(rows), statusRows))
	for _, r := range rows[:min(len(rows), statusRows)] {
		n := StatusNode{Node: r.id, Renewals: len(r.run.renewals), Carried: r.carried,
			HeldUntil: time.UnixMilli(r.run.lastExpires()).UTC()}
		if j := r.run.nextSlot(now); j < len(r.run.renewals) {
			t := time.UnixMilli(r.run.renewals[j].notBefore).UTC()
			n.NextSlot = &t
		}
		st.Nodes = append(st.Nodes, n)
	}
	return st
}

// digestRule names the renewal digest rule the relay applies, for the status page.
func digestRule() string {
	if contracts.RenewalDigestVerified {
		return "verified"
	}
	return "assumed"
}
