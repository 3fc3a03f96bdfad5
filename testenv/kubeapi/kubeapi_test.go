package kubeapi

import (
	"context"
	"os"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// TestAPIServerServesLeases proves the control plane is the real thing the relays need: the
// Relay user creates, updates and reads a Lease, an update from a stale copy is refused as a
// conflict (the optimistic concurrency client-go's LeaseLock relies on), and RBAC refuses the
// Relay user what its Role does not grant.
func TestAPIServerServesLeases(t *testing.T) {
	s := Start(t)
	t.Logf("kube-apiserver RSS %d MiB, etcd RSS %d MiB", s.api.rssKiB()/1024, s.etcd.rssKiB()/1024)
	const ns = "relay-ha"
	s.SetupNamespace(ns)
	ctx := context.Background()
	leases := s.Client(Relay).CoordinationV1().Leases(ns)

	now := metav1.NewMicroTime(time.Now())
	created, err := leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "relay"},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To("relay-a"), LeaseDurationSeconds: ptr.To[int32](6),
			AcquireTime: &now, RenewTime: &now,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Lease as %s: %v", Relay, err)
	}
	update := created.DeepCopy()
	update.Spec.HolderIdentity = ptr.To("relay-b")
	updated, err := leases.Update(ctx, update, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update Lease: %v", err)
	}
	if updated.ResourceVersion == created.ResourceVersion {
		t.Errorf("update kept resourceVersion %s", created.ResourceVersion)
	}
	got, err := leases.Get(ctx, "relay", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Lease: %v", err)
	}
	if h := ptr.Deref(got.Spec.HolderIdentity, ""); h != "relay-b" {
		t.Errorf("Lease holder = %q, want relay-b", h)
	}
	stale := created.DeepCopy()
	stale.Spec.HolderIdentity = ptr.To("relay-c")
	if _, err := leases.Update(ctx, stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("update from a stale resourceVersion: err = %v, want a Conflict", err)
	}

	relay := s.Client(Relay)
	if _, err := relay.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("Relay lists Secrets in %s: err = %v, want Forbidden", ns, err)
	}
	if _, err := relay.CoordinationV1().Leases("default").Get(ctx, "relay", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("Relay gets a Lease outside its namespace: err = %v, want Forbidden", err)
	}
	if err := leases.Delete(ctx, "relay", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("Relay deletes its Lease: err = %v, want Forbidden (the Role grants get, create, update)", err)
	}
}

// TestAPIServerRestartsAndServesPods covers the rest of the helper: a Pod with a status.podIP
// the Relay user reads and labels, and an API server stopped and started again on the same port
// and etcd, with its objects kept.
func TestAPIServerRestartsAndServesPods(t *testing.T) {
	s := Start(t)
	const ns = "relay-ha"
	s.SetupNamespace(ns)
	ctx := context.Background()
	if pod := s.CreatePod(ns, "relay-0", "10.1.2.3"); pod.Status.PodIP != "10.1.2.3" || pod.Spec.NodeName != FakeNode {
		t.Fatalf("CreatePod: podIP %q node %q", pod.Status.PodIP, pod.Spec.NodeName)
	}
	pods := s.Client(Relay).CoreV1().Pods(ns)
	patch := []byte(`{"metadata":{"labels":{"relay.serve.zone/role":"standby"}}}`)
	if _, err := pods.Patch(ctx, "relay-0", types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("Relay labels its Pod: %v", err)
	}

	s.StopAPIServer()
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := pods.Get(short, "relay-0", metav1.GetOptions{})
	cancel()
	if err == nil {
		t.Fatalf("Get succeeded with the API server stopped")
	}
	s.StartAPIServer()
	pod, err := pods.Get(ctx, "relay-0", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Get after the restart: %v", err)
	}
	if pod.Status.PodIP != "10.1.2.3" || pod.Labels["relay.serve.zone/role"] != "standby" {
		t.Errorf("after the restart: podIP %q labels %v", pod.Status.PodIP, pod.Labels)
	}
}

// TestProcessServesPods covers the process owner's entry point: the same control plane started
// without a test, its objects created through errors rather than test failures, and its
// temporary directory removed by Stop.
func TestProcessServesPods(t *testing.T) {
	Require(t)
	p, err := StartProcess()
	if err != nil {
		t.Fatal(err)
	}
	dir := p.s.dir
	const ns = "relay-dev"
	if err := p.SetupNamespace(ns); err != nil {
		t.Fatal(err)
	}
	if err := p.SetupNamespace(ns); err == nil {
		t.Errorf("SetupNamespace of an existing namespace succeeded")
	}
	if pod, err := p.CreatePod(ns, "relay-0", "127.0.0.1"); err != nil || pod.Status.PodIP != "127.0.0.1" {
		t.Fatalf("CreatePod: %v", err)
	}
	relay, err := p.Client(Relay)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := relay.CoreV1().Pods(ns).Get(context.Background(), "relay-0", metav1.GetOptions{}); err != nil {
		t.Errorf("Relay reads its Pod: %v", err)
	}
	if _, err := p.Kubeconfig("nobody"); err == nil {
		t.Errorf("Kubeconfig of an unknown user succeeded")
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("Stop left %s: %v", dir, err)
	}
	if err := p.Stop(); err != nil {
		t.Errorf("a second Stop: %v", err)
	}
}
