package kubeapi

import (
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"code.foss.global/serve.zone/relay/testenv/await"
)

// echoPod is a Pod's UDP server: it answers each datagram with its name and the datagram, and
// remembers who sent the last one.
type echoPod struct {
	name string
	pc   *net.UDPConn
	mu   sync.Mutex
	peer netip.AddrPort // guarded by mu
}

func startEcho(t *testing.T, name string) *echoPod {
	t.Helper()
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	e := &echoPod{name: name, pc: pc}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			e.mu.Lock()
			e.peer = from
			e.mu.Unlock()
			pc.WriteToUDPAddrPort(append([]byte(name+":"), buf[:n]...), from)
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return e
}

func (e *echoPod) addr() string { return e.pc.LocalAddr().String() }

// TestServiceForwardsUDPToTheSelectedPod: a client's UDP flow through the Service reaches the
// Pod labelled leader and its answers come back; when the label moves, the same flow (the same
// client address and port) goes to the new leader, and a datagram the old one still sends it is
// dropped; once the leader's Pod is marked unready no Pod is selected, and datagrams are dropped
// and counted.
func TestServiceForwardsUDPToTheSelectedPod(t *testing.T) {
	s := Start(t)
	const ns, label = "svc-udp", "relay.serve.zone/role"
	s.SetupNamespace(ns)
	admin := s.Client(Admin)
	pods := admin.CoreV1().Pods(ns)
	a, b := startEcho(t, "a"), startEcho(t, "b")
	setPod := func(name, role, udp string) {
		t.Helper()
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{label: role},
			"annotations": map[string]string{"test/udp": udp}}})
		if _, err := pods.Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s.CreatePod(ns, "relay-a", "127.0.0.1")
	s.CreatePod(ns, "relay-b", "127.0.0.1")
	setPod("relay-a", "leader", a.addr())
	setPod("relay-b", "standby", b.addr())
	svc, err := StartService(admin, ns, label, "leader", func(*corev1.Pod) (string, bool) { return "", false },
		WithUDP(func(p *corev1.Pod) (netip.AddrPort, bool) {
			ap, err := netip.ParseAddrPort(p.Annotations["test/udp"])
			return ap, err == nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()

	client, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// ask sends payload through the Service and returns the first answer within 200 ms ("" when
	// none): polling while the Service's watch catches up with a label.
	ask := func(payload string) string {
		client.WriteToUDPAddrPort([]byte(payload), svc.UDPAddr())
		client.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		buf := make([]byte, 1500)
		n, _, err := client.ReadFromUDPAddrPort(buf)
		if err != nil {
			return ""
		}
		return string(buf[:n])
	}
	if !await.Within(20*time.Second, func() bool { return ask("1") == "a:1" }) {
		t.Fatal("the flow never reached the leader a")
	}
	a.mu.Lock()
	flowAtA := a.peer
	a.mu.Unlock()

	setPod("relay-a", "standby", a.addr())
	setPod("relay-b", "leader", b.addr())
	if !await.Within(20*time.Second, func() bool { return ask("2") == "b:2" }) {
		t.Fatal("the flow never moved to the new leader b")
	}
	b.mu.Lock()
	flowAtB := b.peer
	b.mu.Unlock()
	if flowAtA != flowAtB {
		t.Errorf("the flow reached a from %s and b from %s: one flow, one source", flowAtA, flowAtB)
	}
	a.pc.WriteToUDPAddrPort([]byte("a:late"), flowAtA) // the old leader answers late
	if got := ask("3"); got != "b:3" {
		t.Fatalf("after the old leader's late answer the client read %q, want b:3", got)
	}

	s.SetPodReady(ns, "relay-b", false) // its container died: the kubelet marks it unready
	before := svc.UDPDropped()
	if !await.Within(20*time.Second, func() bool { ask("4"); return svc.UDPDropped() > before }) {
		t.Fatal("with no Pod selected nothing was dropped")
	}
}
