package failover

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// Event deadlines: generous, as the machine may be loaded; the figures themselves come from the
// benchmark (bench_test.go), never from these.
const (
	startDeadline = 40 * time.Second // the first leader elected and attached
	takeover      = leaseDuration + 20*time.Second
	flowDeadline  = 30 * time.Second // every node answered again
)

// TestHAGracefulHandover: SIGTERM the leader of two. It steps down (Cloudly's socket closed, the
// Lease released, its Pod relabelled), exits 0, and the standby takes over; the nodes come back
// through the Service, register through the new leader, and their requests are answered again.
func TestHAGracefulHandover(t *testing.T) {
	c := newCluster(t)
	c.start("relay-a")
	c.start("relay-b")
	first := c.waitLeader(startDeadline)
	f := startFleet(c.svc.URL(), 4)
	defer f.close()
	c.waitFlowing(f, time.Now())
	c.waitStandbysFollow(first, anyRuns)

	at := time.Now()
	if err := first.terminate(); err != nil {
		t.Errorf("the leader's exit on SIGTERM: %v", err)
	}
	c.deletePod(first.name)
	second := c.waitLeader(takeover)
	c.waitFlowing(f, time.Now())
	for _, d := range f.nodes {
		if got := c.cloudly.NodeRegistrations(d.n.ID); got < 2 {
			t.Errorf("%s registered with Cloudly %d times, want again through the new leader", d.n.ID, got)
		}
	}
	t.Logf("handover %s → %s: node requests refused for at most %s", first.name, second.name, f.refusedWindow(at).Round(time.Millisecond))
}

// TestHALeaderKilled: SIGKILL the leader of two. Nothing is released: the standby takes the
// Lease once it expires, attaches, and the nodes come back to it.
func TestHALeaderKilled(t *testing.T) {
	c := newCluster(t)
	c.start("relay-a")
	c.start("relay-b")
	first := c.waitLeader(startDeadline)
	f := startFleet(c.svc.URL(), 4)
	defer f.close()
	c.waitFlowing(f, time.Now())

	regs := c.cloudly.Registrations()
	at := time.Now()
	first.kill()
	attached := c.waitAttachedAfter(regs, takeover)
	c.deletePod(first.name) // the Pod goes with its node; a restarted container would label itself standby
	second := c.waitLeader(takeover)
	c.waitFlowing(f, time.Now())
	t.Logf("SIGKILL of %s: %s attached %s later (lease %s)", first.name, second.name, attached.Sub(at).Round(time.Millisecond), leaseDuration)
}

// TestHAAPIServerStopped: with the API server gone the leader cannot renew, so it fences itself
// within its renew deadline — Cloudly's socket closed, no longer the leader — while the standby,
// which cannot reach the API either, never takes over. Once the API server is back one relay
// leads again, its Pod alone labelled leader, and the nodes are answered.
func TestHAAPIServerStopped(t *testing.T) {
	c := newCluster(t)
	a := c.start("relay-a")
	b := c.start("relay-b")
	first := c.waitLeader(startDeadline)
	f := startFleet(c.svc.URL(), 4)
	defer f.close()
	c.waitFlowing(f, time.Now())

	regs := c.cloudly.Registrations()
	at := time.Now()
	c.kube.StopAPIServer()
	c.eventually("the leader fenced: Cloudly holds no attached socket", renewDeadline+fenceSlack, func() bool {
		return c.cloudly.AttachedSockets() == 0
	})
	fenced := time.Since(at)
	for _, p := range []*relayProc{a, b} {
		c.eventually(p.name+" says it stands by", 10*time.Second, func() bool {
			st, err := p.status()
			return err == nil && st.HA.Role == "standby" && !st.Cloudly.Attached
		})
	}
	if got := c.cloudly.Registrations(); got != regs {
		t.Errorf("a relay attached while the API server was away (%d registrations, %d before)", got, regs)
	}
	c.kube.StartAPIServer()
	second := c.waitLeader(takeover)
	c.waitFlowing(f, time.Now())
	t.Logf("API server stopped: %s fenced %s later (renew deadline %s); %s leads once it is back",
		first.name, fenced.Round(time.Millisecond), renewDeadline, second.name)
}

// fenceSlack is what a fence may take beyond the renew deadline: the check runs every half
// retry period, the Cloudly socket's close handshake takes up to a second, and a loaded machine.
const fenceSlack = 4 * time.Second

// TestHAFailoverDuringCloudlyOutage: the leader holds an escrowed run for every node and copies
// it to the standby; Cloudly goes away, the leader releases the current renewals, and is then
// killed. The standby leads while detached: the nodes re-bind to it with their byte-identical
// registrations and receive every renewal whose slot opens — none missed. Cloudly back, the new
// leader attaches and the nodes register through it.
func TestHAFailoverDuringCloudlyOutage(t *testing.T) {
	c := newCluster(t)
	c.start("relay-a")
	c.start("relay-b")
	first := c.waitLeader(startDeadline)
	f := startFleet(c.svc.URL(), 3)
	defer f.close()
	c.waitFlowing(f, time.Now())
	runs := c.holdRuns(t, f, time.Now())
	c.waitStandbysFollow(first, len(f.nodes))

	c.cloudly.SetAvailable(false)
	from := runs.sequenceAt(time.Now()) // while attached the relay releases nothing: Cloudly does
	c.eventually("the current renewal released to every node while detached", flowDeadline, func() bool {
		for _, d := range f.nodes {
			if d.n.AdmittedRenewalSequence() < from {
				return false
			}
		}
		return true
	})
	killed := time.Now()
	first.kill()
	c.deletePod(first.name)
	// Two more slots open under the new leader: each must reach every node.
	want := runs.sequenceAt(killed) + 2
	c.eventually(fmt.Sprintf("renewal %d released to every node by the new leader", want), takeover+2*runs.Step, func() bool {
		for _, d := range f.nodes {
			if d.n.AdmittedRenewalSequence() < want {
				return false
			}
		}
		return true
	})
	for _, d := range f.nodes {
		if missed := runs.missed(d.renewals.Receipts(), from, want); len(missed) > 0 {
			t.Errorf("%s missed renewals %v across the failover (killed at %s); it received:\n%s",
				d.n.ID, missed, killed.Format(time.StampMilli), runs.explain(d.renewals.Receipts(), from, want))
		}
	}
	c.cloudly.SetAvailable(true)
	c.waitLeader(takeover)
	c.waitFlowing(f, time.Now())
}

// TestHARollingUpgrade of three hands over once: for each old replica a new one starts (maxSurge
// 1) and is ready, then the ReplicaSet picks an old Pod to delete by pod-deletion-cost, lowest
// first, as its controller does; the leader annotates its Pod high and the standbys low, so the
// standbys go first and the leader last. Among equal costs this ReplicaSet picks the leader: the
// controller's other criteria (readiness times, age) are nothing the relays can count on. The
// chosen Pod's relay gets SIGTERM and the Pod is deleted (maxUnavailable 0). After every step one
// relay leads, attached, and the nodes are answered; over the whole upgrade Cloudly sees exactly
// one change of leader, to a new replica.
func TestHARollingUpgrade(t *testing.T) {
	c := newCluster(t)
	old := map[string]*relayProc{}
	for _, name := range []string{"relay-0", "relay-1", "relay-2"} {
		old[name] = c.start(name)
	}
	first := c.waitLeader(startDeadline)
	f := startFleet(c.svc.URL(), 4)
	defer f.close()
	c.waitFlowing(f, time.Now())
	before := len(c.cloudly.RegisteredRelays())

	for i := range 3 {
		c.start(fmt.Sprintf("relay-%d-next", i))
		l := c.waitLeader(takeover)
		p := c.pickForDeletion(old, l)
		delete(old, p.name)
		at := time.Now()
		if err := p.terminate(); err != nil {
			t.Errorf("%s's exit on SIGTERM: %v", p.name, err)
		}
		c.deletePod(p.name)
		next := c.waitLeader(takeover)
		c.waitFlowing(f, time.Now())
		if p == l {
			t.Logf("step %d: %s handed over to %s: node requests refused for at most %s", i, p.name, next.name, f.refusedWindow(at).Round(time.Millisecond))
		}
	}
	l := c.waitLeader(takeover)
	if !strings.HasSuffix(l.name, "-next") {
		t.Errorf("after the upgrade %s leads, not a new replica", l.name)
	}
	if n := len(c.running()); n != 3 {
		t.Errorf("%d replicas run after the upgrade, want 3", n)
	}
	regs := c.cloudly.RegisteredRelays()
	changes := 0
	prev := first.name
	for _, r := range regs[before:] {
		if r != prev {
			changes++
		}
		prev = r
	}
	if changes != 1 {
		t.Errorf("the leader changed %d times over the upgrade (registrations by %v after %s's), want once", changes, regs[before:], first.name)
	}
}

// deletionCost is the annotation the ReplicaSet controller ranks Pods by when it scales down:
// the lowest cost is deleted first; no annotation is 0.
const deletionCost = "controller.kubernetes.io/pod-deletion-cost"

// pickForDeletion is the ReplicaSet's choice among the old replicas: the lowest pod-deletion-cost;
// among equals the current leader l, the worst case. It checks on the way that the leader's Pod
// is annotated above every standby's.
func (c *cluster) pickForDeletion(old map[string]*relayProc, l *relayProc) *relayProc {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := c.admin.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	cost := map[string]int{}
	for _, pod := range list.Items {
		v, err := strconv.Atoi(pod.Annotations[deletionCost])
		if err != nil && pod.Annotations[deletionCost] != "" {
			c.t.Errorf("Pod %s: %s is %q, not an integer", pod.Name, deletionCost, pod.Annotations[deletionCost])
		}
		cost[pod.Name] = v
	}
	for name := range cost {
		if name != l.name && cost[name] >= cost[l.name] {
			c.t.Errorf("Pod %s (a standby) has %s %d, not below the leader %s's %d", name, deletionCost, cost[name], l.name, cost[l.name])
		}
	}
	var pick *relayProc
	for _, p := range old {
		switch {
		case pick == nil, cost[p.name] < cost[pick.name], cost[p.name] == cost[pick.name] && (p == l || pick != l && p.name < pick.name):
			pick = p
		}
	}
	return pick
}

// waitFlowing waits until every node of f has had a request answered after t.
func (c *cluster) waitFlowing(f *fleet, t time.Time) {
	c.t.Helper()
	if !poll(flowDeadline, func() bool { return f.allAnsweredSince(t) }) {
		c.t.Fatalf("nodes not answered within %s; refusals so far: %v", flowDeadline, f.reasons())
	}
}

// waitStandbysFollow waits until every running relay but leader stands by with a complete copy
// of what the leader replicates, and that is runs runs (anyRuns: whatever the leader holds).
func (c *cluster) waitStandbysFollow(leader *relayProc, runs int) {
	c.t.Helper()
	for _, p := range c.running() {
		if p != leader {
			c.waitFollows(p, leader, runs)
		}
	}
}

// waitFollows waits until p — in whichever process its container runs now — stands by with a
// complete copy of what leader replicates, and that is runs runs (anyRuns: whatever it holds).
func (c *cluster) waitFollows(p, leader *relayProc, runs int) {
	c.t.Helper()
	c.eventually(p.name+" follows the leader with a complete copy", flowDeadline, func() bool {
		l, err := leader.status()
		if err != nil || runs != anyRuns && l.HA.Replication.Runs != runs {
			return false
		}
		st, err := p.status()
		r := st.HA.Replication
		return err == nil && st.HA.Role == "standby" && r.Connected == 1 && r.Complete && r.Runs == l.HA.Replication.Runs
	})
}

// anyRuns tells waitStandbysFollow to expect as many runs as the leader holds.
const anyRuns = -1

// waitAttachedAfter waits until Cloudly has accepted a registration beyond before and holds an
// attached socket, and returns when it saw that (polled every 5 ms).
func (c *cluster) waitAttachedAfter(before int64, d time.Duration) time.Time {
	c.t.Helper()
	await.Until(c.t, fmt.Sprintf("a relay attached within %s", d), d, func() bool {
		return c.cloudly.Registrations() > before && c.cloudly.AttachedSockets() == 1
	})
	return time.Now()
}

// escrowRuns is the run Cloudly held for every node: its slots and windows.
type escrowRuns struct {
	sim.EscrowRun
}

// holdRuns has Cloudly hold a run for every node of f on the leader: slots every 3 s from start,
// 6 s windows (each overlapping the next), so the first is current at once. Its sequences
// continue past every node's newest admitted renewal, as a real run after an earlier one does.
func (c *cluster) holdRuns(t testing.TB, f *fleet, start time.Time) escrowRuns {
	t.Helper()
	first := int64(1)
	for _, d := range f.nodes {
		first = max(first, d.n.AdmittedRenewalSequence()+1)
	}
	r := escrowRuns{sim.EscrowRun{Start: start, Count: 30, Step: 3 * time.Second, Window: 6 * time.Second, FirstSequence: first}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, d := range f.nodes {
		run := r.EscrowRun
		run.Session = c.cloudly.Session(d.n.ID)
		body, err := run.Request()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.cloudly.Call(ctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, body); err != nil {
			t.Fatalf("hold a run for %s: %v", d.n.ID, err)
		}
	}
	return r
}

// sequenceAt is the sequence whose slot is the newest opened at t.
func (r escrowRuns) sequenceAt(t time.Time) int64 {
	return r.FirstSequence + int64(t.Sub(r.Start)/r.Step)
}

// explain lists the receipts of sequences from…upto and later with the window of each, for a
// failure to show whether a renewal came early, late or not at all.
func (r escrowRuns) explain(receipts []sim.RenewalReceipt, from, upto int64) string {
	windows := r.Windows()
	var b strings.Builder
	for s := max(from, r.FirstSequence); s <= upto && s-r.FirstSequence < int64(len(windows)); s++ {
		w := windows[s-r.FirstSequence]
		fmt.Fprintf(&b, "\twindow of %d: %s – %s\n", s,
			time.UnixMilli(w.NotBefore).Format(time.StampMilli), time.UnixMilli(w.ExpiresAt).Format(time.StampMilli))
	}
	for _, rc := range receipts {
		if rc.Sequence >= from {
			fmt.Fprintf(&b, "\treceipt %d at %s: %s\n", rc.Sequence, rc.At.Format(time.StampMilli), rc.Status)
		}
	}
	return b.String()
}

// missed lists the sequences from…upto the node did not get while they were current: neither that
// renewal nor a later one admitted within its window.
func (r escrowRuns) missed(receipts []sim.RenewalReceipt, from, upto int64) []int64 {
	windows := r.Windows()
	var out []int64
	for s := max(from, r.FirstSequence); s <= upto && s-r.FirstSequence < int64(len(windows)); s++ {
		w := windows[s-r.FirstSequence]
		covered := false
		for _, rc := range receipts {
			at := rc.At.UnixMilli()
			if rc.Status == contracts.ApplyStatusAccepted && rc.Sequence >= s && at >= w.NotBefore && at < w.ExpiresAt {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, s)
		}
	}
	return out
}
