package failover

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/testenv/kubeapi"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// The replication channel across process failures: a hold is answered only once the standby has
// it, so a leader lost right after { held } loses no run; a standby that dies or stops is reported
// gone by the leader.

// replicationAnnotation is where each relay names its replication address (ha.ReplicationAnnotation).
const replicationAnnotation = "relay.serve.zone/replication"

// lossyLink stands between a standby and the leader's replication port: the leader's bytes reach
// the standby latency late, and what is still on the way when the leader's side goes is lost with
// it — the leader's host lost with what its kernel had not sent yet.
type lossyLink struct {
	ln      net.Listener
	target  string
	latency time.Duration
}

func startLossyLink(t *testing.T, target string, latency time.Duration) *lossyLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &lossyLink{ln: ln, target: target, latency: latency}
	t.Cleanup(func() { ln.Close() })
	go l.serve()
	return l
}

func (l *lossyLink) serve() {
	for {
		standby, err := l.ln.Accept()
		if err != nil {
			return
		}
		leader, err := net.Dial("tcp", l.target)
		if err != nil {
			standby.Close()
			continue
		}
		go func() { io.Copy(leader, standby); leader.Close() }()
		type chunk struct {
			b  []byte
			at time.Time
		}
		queue := make(chan chunk, 4096)
		lost := make(chan struct{})
		go func() {
			defer close(lost)
			for {
				b := make([]byte, 32<<10)
				n, err := leader.Read(b)
				if n > 0 {
					queue <- chunk{b[:n], time.Now().Add(l.latency)}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() {
			defer standby.Close()
			for {
				select {
				case <-lost:
					return // the leader is gone: so is what it had in flight
				case c := <-queue:
					select {
					case <-lost:
						return
					case <-time.After(time.Until(c.at)): // the link's latency
					}
					if _, err := standby.Write(c.b); err != nil {
						return
					}
				}
			}
		}()
	}
}

// annotateReplication points the Pod's replication annotation at addr, as if the relay had.
// replicationAddr is the replication address relay pod annotated its Pod with (it binds port 0).
func (c *cluster) replicationAddr(pod string) string {
	c.t.Helper()
	var addr string
	c.eventually("Pod "+pod+" names its replication address", flowDeadline, func() bool {
		p, err := c.kube.Client(kubeapi.Admin).CoreV1().Pods(namespace).Get(context.Background(), pod, metav1.GetOptions{})
		if err == nil {
			addr = p.Annotations[replicationAnnotation]
		}
		return addr != ""
	})
	return addr
}

func (c *cluster) annotateReplication(pod, addr string) {
	c.t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{replicationAnnotation: addr}}})
	if _, err := c.kube.Client(kubeapi.Admin).CoreV1().Pods(namespace).Patch(context.Background(), pod, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		c.t.Fatalf("annotate Pod %s: %v", pod, err)
	}
}

// replicationStatus is /status.json's ha.replication and the escrow's runs, as these tests read
// them.
type replicationStatus struct {
	Role        string
	Connected   int
	Runs        int
	Complete    bool
	LastDropped *struct {
		Reason string `json:"reason"`
		Pod    string `json:"pod"`
	}
	EscrowRuns int
}

func (p *relayProc) replication() (replicationStatus, error) {
	var raw struct {
		HA struct {
			Role        string `json:"role"`
			Replication struct {
				Connected   int  `json:"connected"`
				Runs        int  `json:"runs"`
				Complete    bool `json:"complete"`
				LastDropped *struct {
					Reason string `json:"reason"`
					Pod    string `json:"pod"`
				} `json:"lastDropped"`
			} `json:"replication"`
		} `json:"ha"`
		Parts []struct {
			Name   string `json:"name"`
			Status struct {
				Runs int `json:"runs"`
			} `json:"status"`
		} `json:"parts"`
	}
	resp, err := adminClient.Get("http://" + p.current().admin + "/status.json")
	if err != nil {
		return replicationStatus{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return replicationStatus{}, fmt.Errorf("/status.json answered %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		return replicationStatus{}, err
	}
	r := raw.HA.Replication
	st := replicationStatus{Role: raw.HA.Role, Connected: r.Connected, Runs: r.Runs, Complete: r.Complete, LastDropped: r.LastDropped}
	for _, part := range raw.Parts {
		if part.Name == "escrow" {
			st.EscrowRuns = part.Status.Runs
		}
	}
	return st, nil
}

// TestHALeaderKilledRightAfterHeld: the standby copies the leader over a link with latency that
// loses what is in flight when the leader goes. Cloudly holds a run for every node and the leader
// is SIGKILLed the moment the last { held } arrives, Cloudly going away with it: the standby,
// leading detached, holds every run and releases each node's renewals. No run is lost.
func TestHALeaderKilledRightAfterHeld(t *testing.T) {
	c := newCluster(t)
	// A generous acknowledgement bound: the link's latency and a loaded machine must not make the
	// leader give up on its standby, which is what this test is not about.
	ack := []string{"--ha-replication-ack", "20s"}
	first := c.start("relay-a", ack...)
	c.waitLeader(startDeadline)
	link := startLossyLink(t, c.replicationAddr(first.name), 300*time.Millisecond)
	c.annotateReplication(first.name, link.ln.Addr().String())
	second := c.start("relay-b", ack...)
	f := startFleet(c.svc.URL(), 3)
	defer f.close()
	c.waitFlowing(f, time.Now())
	c.waitStandbysFollow(first, anyRuns)

	run := sim.EscrowRun{Start: time.Now(), Count: 30, Step: 3 * time.Second, Window: 6 * time.Second, FirstSequence: 1}
	for _, d := range f.nodes {
		run.FirstSequence = max(run.FirstSequence, d.n.AdmittedRenewalSequence()+1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, d := range f.nodes {
		r := run
		r.Session = c.cloudly.Session(d.n.ID)
		body, err := r.Request()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.cloudly.Call(ctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, body); err != nil {
			t.Fatalf("hold a run for %s: %v", d.n.ID, err)
		}
		if i == len(f.nodes)-1 {
			first.kill() // the moment the last { held } is in
			c.cloudly.SetAvailable(false)
		}
	}
	c.deletePod(first.name)
	c.eventually(second.name+" leads", takeover, func() bool {
		st, err := second.replication()
		return err == nil && st.Role == "leader"
	})
	st, err := second.replication()
	if err != nil {
		t.Fatal(err)
	}
	if st.EscrowRuns != len(f.nodes) {
		t.Errorf("the new leader holds %d runs, want the %d held before the failover", st.EscrowRuns, len(f.nodes))
	}
	c.eventually("a renewal of its run released to every node by the new leader", flowDeadline, func() bool {
		for _, d := range f.nodes {
			if d.n.AdmittedRenewalSequence() < run.FirstSequence {
				return false
			}
		}
		return true
	})
	c.cloudly.SetAvailable(true)
	c.waitLeader(takeover)
}

// TestHAStandbyGoneIsReported: a SIGKILLed standby is reported gone by the leader
// (/status.json's ha.replication); so is one SIGSTOPped, once it has been silent past the silence
// bound — and, resumed, it copies the whole state again.
func TestHAStandbyGoneIsReported(t *testing.T) {
	c := newCluster(t)
	first := c.start("relay-a")
	c.waitLeader(startDeadline)
	killed := c.start("relay-b")
	c.waitStandbysFollow(first, anyRuns)
	connected := func(n int) func() bool {
		return func() bool { st, err := first.replication(); return err == nil && st.Connected == n }
	}
	c.eventually("the leader feeds its standby", flowDeadline, connected(1))

	killed.kill()
	c.deletePod(killed.name)
	c.eventually("the leader reports the killed standby gone", 30*time.Second, connected(0))
	if st, _ := first.replication(); st.LastDropped == nil || st.LastDropped.Pod != killed.name {
		t.Errorf("the leader's last dropped standby: %+v", st.LastDropped)
	}

	stopped := c.start("relay-c")
	c.waitStandbysFollow(first, anyRuns)
	c.eventually("the leader feeds its new standby", flowDeadline, connected(1))
	proc := stopped.current().cmd.Process
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := sync.OnceFunc(func() { proc.Signal(syscall.SIGCONT) })
	defer resumed()
	c.eventually("the leader reports the stopped standby gone", 40*time.Second, connected(0))
	if st, _ := first.replication(); st.LastDropped == nil || st.LastDropped.Pod != stopped.name || st.LastDropped.Reason != "silent" {
		t.Errorf("the leader's last dropped standby: %+v", st.LastDropped)
	}
	resumed()
	c.waitStandbysFollow(first, anyRuns)
	c.eventually("the resumed standby fed again", flowDeadline, connected(1))
}
