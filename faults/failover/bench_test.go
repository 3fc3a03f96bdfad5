package failover

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkHA measures docs/ha.md's goals on two relay processes, ten nodes and the real API
// server; each iteration is one of each:
//
//   - handover-refused-max-ms and -p50-ms: the longest run of refused requests of any node across a graceful
//     handover (SIGTERM of the leader), from its first refused request to its next answered one
//     (goal ≤ 2000);
//   - sigkill-failover-max-ms and -p50-ms: from the leader's SIGKILL to Cloudly accepting the standby's
//     registration (goal ≤ lease duration + 2 s, 6000 here);
//   - renewals-missed: renewal slots that opened during a Cloudly outage across a SIGKILL
//     failover and did not reach a node while current (goal 0);
//   - two-attached: registrations Cloudly accepted while another relay's socket was attached
//     (goal 0).
//
// Each stopped replica is replaced, as its ReplicaSet would, before the next step.
//
//	go test -run '^$' -bench HA -benchtime 5x ./faults/failover/
func BenchmarkHA(b *testing.B) {
	c := newCluster(b)
	c.start("relay-0")
	c.start("relay-1")
	c.waitLeader(startDeadline)
	f := startFleet(c.svc.URL(), 10)
	defer f.close()
	c.waitFlowing(f, time.Now())
	next := 2
	replace := func(p *relayProc) {
		c.deletePod(p.name)
		c.start(fmt.Sprintf("relay-%d", next))
		next++
	}
	var handovers, failovers []time.Duration
	var missed int
	for range b.N {
		l := c.waitLeader(takeover)
		c.waitStandbysFollow(l, anyRuns)
		at := time.Now()
		if err := l.terminate(); err != nil {
			b.Errorf("the leader's exit on SIGTERM: %v", err)
		}
		replace(l)
		c.waitLeader(takeover)
		c.waitFlowing(f, time.Now())
		handovers = append(handovers, f.refusedWindow(at))

		l = c.waitLeader(takeover)
		regs := c.cloudly.Registrations()
		at = time.Now()
		l.kill()
		failovers = append(failovers, c.waitAttachedAfter(regs, takeover).Sub(at))
		replace(l)
		l = c.waitLeader(takeover)
		c.waitFlowing(f, time.Now())

		runs := c.holdRuns(b, f, time.Now())
		c.waitStandbysFollow(l, len(f.nodes))
		c.cloudly.SetAvailable(false)
		from := runs.sequenceAt(time.Now())
		c.eventually("the current renewal released while detached", flowDeadline, func() bool {
			for _, d := range f.nodes {
				if d.n.AdmittedRenewalSequence() < from {
					return false
				}
			}
			return true
		})
		killed := time.Now()
		l.kill()
		want := runs.sequenceAt(killed) + 2
		c.eventually("two more renewals released by the new leader", takeover+2*runs.Step, func() bool {
			for _, d := range f.nodes {
				if d.n.AdmittedRenewalSequence() < want {
					return false
				}
			}
			return true
		})
		for _, d := range f.nodes {
			missed += len(runs.missed(d.renewals.Receipts(), from, want))
		}
		c.cloudly.SetAvailable(true)
		replace(l)
		c.waitLeader(takeover)
		c.waitFlowing(f, time.Now())
	}
	b.Logf("refused windows per handover %v; SIGKILL to attached %v", handovers, failovers)
	b.ReportMetric(float64(slices.Max(handovers).Milliseconds()), "handover-refused-max-ms")
	b.ReportMetric(float64(median(handovers).Milliseconds()), "handover-refused-p50-ms")
	b.ReportMetric(float64(slices.Max(failovers).Milliseconds()), "sigkill-failover-max-ms")
	b.ReportMetric(float64(median(failovers).Milliseconds()), "sigkill-failover-p50-ms")
	b.ReportMetric(float64(missed), "renewals-missed")
	b.ReportMetric(float64(c.cloudly.TwoAttached()), "two-attached")
}

// BenchmarkHAVPN measures the VPN's goal across a failover: two relays with hubs, two members
// joined through the Service with the real client, each sending the other a packet every 20 ms.
// Each iteration SIGKILLs the leader (its Pod marked unready, as the kubelet does once the
// container died) and measures, over the two members, the longest time from the kill to the
// first packet delivered again:
//
//   - vpn-gap-max-ms and -p50-ms: goal ≤ lease duration + 2 s (6000 here).
//
// The membership is pushed once, to the first leader; every later leader serves its copy. The
// killed replica is replaced, as its ReplicaSet would, and the new standby copies the membership
// before the next kill.
//
//	go test -run '^$' -bench HAVPN -benchtime 5x ./faults/failover/
func BenchmarkHAVPN(b *testing.B) {
	c, f := vpnCluster(b)
	next := 2
	var gaps []time.Duration
	for range b.N {
		killed, l := c.killLeaderUnderFlow(f)
		_, resumed, _, _ := f.gapAcross(killed)
		gaps = append(gaps, resumed)
		p := c.start(fmt.Sprintf("relay-%d", next))
		next++
		c.waitHub(p, "holding the leader's membership, unserved", func(h hubStatus) bool { return !h.Serving && h.Generation == 1 })
		c.waitDelivered(f, time.Now(), 20, "the members' packets flowing through "+l.name)
	}
	b.Logf("VPN flow resumed after each SIGKILL in %v (lease %s)", gaps, leaseDuration)
	b.ReportMetric(float64(slices.Max(gaps).Milliseconds()), "vpn-gap-max-ms")
	b.ReportMetric(float64(median(gaps).Milliseconds()), "vpn-gap-p50-ms")
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkHAFaults measures how long a cluster goes without an attached relay after the two
// faults that pause what the election stands on, on two relay processes, four nodes and the real
// API server; each iteration is one of each:
//
//   - sigstop-attached-max-ms and -p50-ms: the leader's process stopped (SIGSTOP), from the stop
//     to Cloudly accepting the standby's registration (goal ≤ lease duration + 2 s, 6000 here);
//     the stopped relay is then resumed, ends its term and comes back a standby;
//
//   - brownout-attached-max-ms and -p50-ms: the API server stopped past the renew deadline, so
//     the leader fences, from the API server's resumption to Cloudly accepting a registration
//     (goal ≤ lease duration + 2 s);
//
//   - two-attached and late-acts: registrations Cloudly accepted while another relay's socket
//     was attached and acting, and requests that reached Cloudly on a socket after another
//     relay attached (goal 0 each).
//
//     go test -run '^$' -bench HAFaults -benchtime 10x ./faults/failover/
func BenchmarkHAFaults(b *testing.B) {
	c := newCluster(b)
	c.start("relay-a")
	c.start("relay-b")
	c.waitLeader(startDeadline)
	f := startFleet(c.svc.URL(), 4)
	defer f.close()
	c.waitFlowing(f, time.Now())
	var stops, brownouts []time.Duration
	for range b.N {
		l := c.waitLeader(takeover)
		c.waitStandbysFollow(l, anyRuns)
		next := c.other(l)
		restarts := l.restartCount()
		regs := c.cloudly.Registrations()
		at := time.Now()
		l.freeze()
		stops = append(stops, c.waitAttachedAfter(regs, takeover).Sub(at))
		c.waitAttachedLeader(next, takeover)
		l.thaw()
		c.eventually(l.name+"'s term ended: its process exited 0 and was started again", takeover, func() bool {
			return l.restartCount() > restarts
		})
		c.waitFollows(l, next, anyRuns)
		c.waitFlowing(f, time.Now())

		l = c.waitLeader(takeover)
		c.waitStandbysFollow(l, anyRuns)
		c.kube.PauseAPIServer()
		c.eventually("the leader fenced: Cloudly holds no attached socket", renewDeadline+fenceSlack, func() bool {
			return c.cloudly.AttachedSockets() == 0
		})
		regs = c.cloudly.Registrations()
		c.kube.ResumeAPIServer()
		at = time.Now()
		brownouts = append(brownouts, c.waitAttachedAfter(regs, takeover).Sub(at))
		c.waitLeader(takeover)
		c.waitFlowing(f, time.Now())
	}
	b.Logf("SIGSTOP to attached %v; API resumed to attached %v (lease %s)", stops, brownouts, leaseDuration)
	b.ReportMetric(float64(slices.Max(stops).Milliseconds()), "sigstop-attached-max-ms")
	b.ReportMetric(float64(median(stops).Milliseconds()), "sigstop-attached-p50-ms")
	b.ReportMetric(float64(slices.Max(brownouts).Milliseconds()), "brownout-attached-max-ms")
	b.ReportMetric(float64(median(brownouts).Milliseconds()), "brownout-attached-p50-ms")
	b.ReportMetric(float64(c.cloudly.TwoAttached()), "two-attached")
	late := 0
	for _, n := range c.cloudly.LateActs() {
		late += n
	}
	b.ReportMetric(float64(late), "late-acts")
}
