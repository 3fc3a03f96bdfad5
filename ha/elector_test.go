package ha_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.foss.global/serve.zone/relay/ha"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/kubeapi"
)

// Short timings for tests, in docs/ha.md's proportions.
const (
	leaseDuration = 3 * time.Second
	renewDeadline = 2 * time.Second
	retryPeriod   = 250 * time.Millisecond
)

// fakeReplicated is a replicated part: records in a map.
type fakeReplicated struct {
	mu       sync.Mutex
	records  map[string]string
	watchers []func(string, []byte)
}

func newFake() *fakeReplicated { return &fakeReplicated{records: make(map[string]string)} }

func (f *fakeReplicated) Replicate(send func(string, []byte)) func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, v := range f.records {
		send(k, []byte(v))
	}
	f.watchers = append(f.watchers, send)
	i := len(f.watchers) - 1
	return func() { f.mu.Lock(); f.watchers[i] = nil; f.mu.Unlock() }
}

func (f *fakeReplicated) set(k, v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.records[k] = v
	for _, w := range f.watchers {
		if w != nil {
			w(k, []byte(v))
		}
	}
}

func (f *fakeReplicated) Adopt(k string, v []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v == nil {
		delete(f.records, k)
	} else {
		f.records[k] = string(v)
	}
	return nil
}

func (f *fakeReplicated) ForgetCopy() {}

func (f *fakeReplicated) get(k string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.records[k]
}

// member is one relay's elector, with what its lead func saw.
type member struct {
	name    string
	el      *ha.Elector
	rep     *fakeReplicated
	cancel  context.CancelFunc
	done    chan struct{}
	leading atomic.Bool
	leads   atomic.Int32
	fenced  chan struct{} // closed the first time a leadership ends
	once    sync.Once
}

func startMember(t *testing.T, s *kubeapi.Server, ns, name string, key []byte) *member {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.CreatePod(ns, name, "127.0.0.1")
	m := &member{name: name, rep: newFake(), done: make(chan struct{}), fenced: make(chan struct{})}
	m.el, err = ha.New(ha.Config{LeaseName: "relay", Namespace: ns, Identity: name, PodName: name, PodIP: "127.0.0.1",
		LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
		Client: s.Client(kubeapi.Relay), Replication: ln, ReplicationKey: key, Parts: []ha.Part{{Prefix: "run/", Part: m.rep, Runs: "run/"}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() {
		defer close(m.done)
		m.el.Run(ctx, func(ctx context.Context) {
			m.leading.Store(true)
			m.leads.Add(1)
			<-ctx.Done()
			m.leading.Store(false)
			m.once.Do(func() { close(m.fenced) })
		})
	}()
	t.Cleanup(func() { cancel(); <-m.done })
	return m
}

func (m *member) stop() { m.cancel(); <-m.done }

func eventually(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	await.Until(t, what, d, cond)
}

func roleOf(t *testing.T, s *kubeapi.Server, ns, pod string) string {
	t.Helper()
	p, err := s.Client(kubeapi.Admin).CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p.Labels[ha.RoleLabel]
}

func leaders(ms ...*member) (n int, who *member) {
	for _, m := range ms {
		if m.leading.Load() {
			n++
			who = m
		}
	}
	return n, who
}

// TestElection: against a real API server, one of two relays leads and labels its Pod leader, the
// other a standby; a graceful step down hands over within a retry period or so; the API server
// stopped makes the leader fence itself within its renew deadline, and no one leads until the
// Lease could have expired.
func TestElection(t *testing.T) {
	s := kubeapi.Start(t)
	key := make([]byte, 32)
	rand.Read(key)

	t.Run("one leads, the other stands by, and a step down hands over", func(t *testing.T) {
		const ns = "election"
		s.SetupNamespace(ns)
		a, b := startMember(t, s, ns, "relay-a", key), startMember(t, s, ns, "relay-b", key)
		eventually(t, "one leader", 10*time.Second, func() bool { n, _ := leaders(a, b); return n == 1 })
		_, first := leaders(a, b)
		other := a
		if first == a {
			other = b
		}
		eventually(t, "the Pods labelled by role", 5*time.Second, func() bool {
			return roleOf(t, s, ns, first.name) == ha.RoleLeader && roleOf(t, s, ns, other.name) == ha.RoleStandby
		})
		stopped := time.Now()
		first.stop()
		eventually(t, "the standby leads", 5*time.Second, func() bool { return other.leading.Load() })
		if took := time.Since(stopped); took > 2*time.Second {
			t.Errorf("a released Lease was taken %s later; want about a retry period", took)
		}
		if roleOf(t, s, ns, first.name) != ha.RoleStandby || roleOf(t, s, ns, other.name) != ha.RoleLeader {
			t.Fatal("the Pods' role labels did not follow the handover")
		}
	})

	t.Run("the API server stopped: the leader fences within its renew deadline", func(t *testing.T) {
		const ns = "api-down"
		s.SetupNamespace(ns)
		a, b := startMember(t, s, ns, "relay-a", key), startMember(t, s, ns, "relay-b", key)
		eventually(t, "one leader", 10*time.Second, func() bool { n, _ := leaders(a, b); return n == 1 })
		_, leader := leaders(a, b)
		s.StopAPIServer()
		stopped := time.Now()
		select {
		case <-leader.fenced:
		case <-time.After(renewDeadline + 2*time.Second):
			t.Fatal("the leader kept leading without renewing its Lease")
		}
		if took := time.Since(stopped); took > renewDeadline+retryPeriod {
			t.Errorf("fenced %s after the API server stopped; the renew deadline is %s", took, renewDeadline)
		}
		if n, _ := leaders(a, b); n != 0 {
			t.Fatalf("%d relays lead with the API server stopped", n)
		}
		s.StartAPIServer()
		eventually(t, "a leader once the API server is back", 20*time.Second, func() bool { n, _ := leaders(a, b); return n == 1 })
	})

	t.Run("the leader's records are copied to the standby and survive it", func(t *testing.T) {
		const ns = "replication"
		s.SetupNamespace(ns)
		a, b := startMember(t, s, ns, "relay-a", key), startMember(t, s, ns, "relay-b", key)
		eventually(t, "one leader", 10*time.Second, func() bool { n, _ := leaders(a, b); return n == 1 })
		_, leader := leaders(a, b)
		standby := a
		if leader == a {
			standby = b
		}
		leader.rep.set("run/node-a", `{"held":1}`)
		eventually(t, "the standby's copy", 10*time.Second, func() bool {
			st := standby.el.Status().(ha.Status)
			return st.Replication.Complete && standby.rep.get("run/node-a") == `{"held":1}`
		})
		for i := range 50 {
			leader.rep.set(fmt.Sprintf("run/node-%03d", i), "x")
		}
		eventually(t, "every change copied", 10*time.Second, func() bool { return standby.rep.get("run/node-049") == "x" })
		if st := leader.el.Status().(ha.Status); st.Role != ha.RoleLeader || st.Replication.Connected != 1 || st.Replication.Runs != 51 {
			t.Fatalf("the leader's status: %+v", st)
		}
		leader.stop()
		eventually(t, "the standby leads", 5*time.Second, func() bool { return standby.leading.Load() })
		if standby.rep.get("run/node-a") != `{"held":1}` {
			t.Fatal("the new leader lost the copy")
		}
	})

	t.Run("a standby without the shared key copies nothing", func(t *testing.T) {
		const ns = "wrong-key"
		s.SetupNamespace(ns)
		other := make([]byte, 32)
		rand.Read(other)
		a := startMember(t, s, ns, "relay-a", key)
		eventually(t, "a leads", 10*time.Second, func() bool { return a.leading.Load() })
		a.rep.set("run/node-a", "secret")
		b := startMember(t, s, ns, "relay-b", other)
		eventually(t, "b sees a as the holder", 5*time.Second, func() bool { h, _ := b.el.Holder(); return h == "relay-a" })
		// A standby with the right key, started after b, has its copy: b, had the key not been
		// checked, would have had its own by now.
		c := startMember(t, s, ns, "relay-c", key)
		eventually(t, "c, with the leader's key, copies its records", 10*time.Second, func() bool { return c.rep.get("run/node-a") == "secret" })
		if b.rep.get("run/node-a") != "" || b.el.Status().(ha.Status).Replication.Complete {
			t.Fatal("a standby with another key copied the leader's records")
		}
	})
}
