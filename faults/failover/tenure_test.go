package failover

import (
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
)

// A relay leads only within its tenure, and only once per process: these faults pause what the
// election stands on — the API server, the leader's own process — and hand the Lease back and
// forth, and check at the Cloudly stand-in that no two relays ever act for the cluster, that no
// registration is ever refused for its sequence, and that what was held survives.

// TestHAAPIServerPaused: the API server paused (SIGSTOP) past the renew deadline, then resumed.
// The leader cannot renew: it fences itself — Cloudly's socket closed — and its election term ends
// with it, so that client-go renews nothing more for a relay that no longer leads: the relay
// releases the Lease if the API answers, and its process exits 0 at the end of its term, to be
// started again as a standby. Once the API answers again a relay leads, attached, and the nodes
// are answered.
func TestHAAPIServerPaused(t *testing.T) {
	c := newCluster(t)
	c.start("relay-a")
	c.start("relay-b")
	first := c.waitLeader(startDeadline)
	f := startFleet(c.svc.URL(), 4)
	defer f.close()
	c.waitFlowing(f, time.Now())

	c.kube.PauseAPIServer()
	c.eventually("the leader fenced: Cloudly holds no attached socket", renewDeadline+fenceSlack, func() bool {
		return c.cloudly.AttachedSockets() == 0
	})
	regs := c.cloudly.Registrations()
	c.kube.ResumeAPIServer()
	resumed := time.Now()
	c.eventually(first.name+"'s term ended: its process exited 0 and was started again", takeover, func() bool {
		return first.restartCount() > 0
	})
	attached := c.waitAttachedAfter(regs, takeover)
	second := c.waitLeader(takeover)
	c.waitFlowing(f, time.Now())
	t.Logf("API server paused: %s fenced; %s attached %s after the API answered again (lease %s)",
		first.name, second.name, attached.Sub(resumed).Round(time.Millisecond), leaseDuration)
}

// TestHALeaderStopped: the leader's process stopped (SIGSTOP) while the Lease expires for the
// standby, which takes over — relabelling the stopped relay's Pod standby before it attaches —
// and then resumed (SIGCONT). The resumed relay's tenure ran out while it was stopped: it forwards
// nothing more on its old Cloudly socket (Cloudly counts every request and stream frame that
// arrives on a socket after another relay attached), fences, and exits 0 at the end of its term,
// to come back a standby.
func TestHALeaderStopped(t *testing.T) {
	c := newCluster(t)
	c.start("relay-a")
	c.start("relay-b")
	first := c.waitLeader(startDeadline)
	f := startFleet(c.svc.URL(), 4)
	defer f.close()
	c.waitFlowing(f, time.Now())

	second := c.other(first)
	first.freeze()
	c.waitAttachedLeader(second, takeover)
	if !poll(flowDeadline, func() bool {
		roles, err := c.podRoles()
		return err == nil && roles[first.name] == "standby" && roles[second.name] == "leader"
	}) {
		t.Errorf("%s's Pod is not relabelled standby by the new leader while it is stopped", first.name)
	}
	// Stopped until the successor attached and relabelled its Pod: over a lease duration. The
	// nodes it carried keep their connections to it, and their requests wait in its socket
	// buffers: they are what it would forward once resumed.
	first.thaw()
	c.eventually(first.name+"'s term ended: its process exited 0 and was started again", takeover, func() bool {
		return first.restartCount() > 0
	})
	c.waitFollows(first, second, anyRuns)
	c.waitFlowing(f, time.Now())
	if n := c.cloudly.OverlapsWithStopped(); n != 1 {
		t.Errorf("Cloudly accepted %d registrations while the stopped relay's socket was open, want 1: the fault was not exercised as meant", n)
	}
	if late := c.cloudly.LateActs(); len(late) != 0 {
		t.Errorf("requests reached Cloudly on a socket after another relay attached: %v", late)
	}
}

// TestHASecondTerm: the Lease handed A → B → A. A is stopped until B leads, and resumed; B's
// Cloudly session blips twice (registrations 0, 1, 2); Cloudly holds a run for every node on B,
// which A copies; B steps down and A leads again. A relay whose term ended exits, so A leads
// again in a new process, registering with sequence 0: Cloudly never refuses a registration
// relay-sequence-not-advancing (which would end custody and drop every held run), and A holds,
// leading, every run B was handed.
func TestHASecondTerm(t *testing.T) {
	c := newCluster(t)
	a := c.start("relay-a")
	if l := c.waitLeader(startDeadline); l != a {
		t.Fatalf("%s leads, want relay-a: it started alone", l.name)
	}
	b := c.start("relay-b")
	f := startFleet(c.svc.URL(), 3)
	defer f.close()
	c.waitFlowing(f, time.Now())

	// A → B.
	a.freeze()
	c.waitAttachedLeader(b, takeover)
	a.thaw()
	c.waitFollows(a, b, anyRuns)
	c.waitFlowing(f, time.Now())

	// B's session blips twice.
	for range 2 {
		regs := c.cloudly.Registrations()
		c.cloudly.Drop()
		c.waitAttachedAfter(regs, takeover)
	}
	c.waitFlowing(f, time.Now())
	c.holdRuns(t, f, time.Now())
	c.waitFollows(a, b, len(f.nodes))

	// B → A.
	regs := c.cloudly.Registrations()
	if err := b.terminate(); err != nil {
		t.Errorf("%s's exit on SIGTERM: %v", b.name, err)
	}
	c.deletePod(b.name)
	c.waitAttachedAfter(regs, takeover)
	c.waitAttachedLeader(a, takeover)
	c.waitFlowing(f, time.Now())

	seqs := c.cloudly.Sequences()
	t.Logf("registrationSequence of every registration Cloudly saw: %v, by %v", seqs, c.cloudly.RegisteredRelays())
	for _, v := range c.cloudly.Violations() {
		if strings.Contains(v, string(contracts.RelaySequenceNotAdvancing)) {
			t.Errorf("Cloudly refused a registration: %s", v)
		}
	}
	st, err := a.status()
	if err != nil {
		t.Fatal(err)
	}
	if held := escrowRunsHeld(st); held != len(f.nodes) {
		t.Errorf("%s leads holding %d runs, want the %d held on %s", a.name, held, len(f.nodes), b.name)
	}
}

// other is the running relay that is not p, of two.
func (c *cluster) other(p *relayProc) *relayProc {
	c.t.Helper()
	for _, o := range c.running() {
		if o != p {
			return o
		}
	}
	c.t.Fatalf("no relay runs but %s", p.name)
	return nil
}

// waitAttachedLeader waits until p says it leads and is attached, and the newest registration
// Cloudly accepted is p's. Unlike waitLeader it does not judge the Pods' labels.
func (c *cluster) waitAttachedLeader(p *relayProc, d time.Duration) {
	c.t.Helper()
	c.eventually(p.name+" leads, attached", d, func() bool {
		regs := c.cloudly.RegisteredRelays()
		st, err := p.status()
		return err == nil && st.HA.Role == "leader" && st.Cloudly.Attached && len(regs) > 0 && regs[len(regs)-1] == p.name
	})
}

// escrowRunsHeld is the runs the escrow part says it holds on the status page; -1 when it says
// nothing.
func escrowRunsHeld(st relayStatus) int {
	for _, p := range st.Parts {
		if p.Name == "escrow" {
			return p.Status.Runs
		}
	}
	return -1
}
