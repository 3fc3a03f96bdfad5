package kubeapi

import (
	"context"
	"fmt"
	"slices"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// FakeNode is the node every Pod from CreatePod is bound to. No Node object nor kubelet exists;
// the API server accepts the binding all the same.
const FakeNode = "kubeapi-fake-node"

// RelayRules is what SetupNamespace grants the Relay user by default: what client-go's LeaseLock
// calls on leases (Get, Create, Update: see tools/leaderelection/resourcelock/leaselock.go), and
// on pods get and patch (a relay reads the holder's Pod and labels its own) plus list and watch
// (for a Service stand-in that follows the role label). The chart's Role (docs/ha.md) grants pods only
// get and patch; a test proving the chart's Role passes those rules to SetupNamespace.
func RelayRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "patch", "list", "watch"}},
	}
}

// SetupNamespace creates namespace ns and, in it, a Role "relay" with rules (RelayRules when
// none are given) bound to the Relay user, and returns once the API server's authorizer applies
// the binding: every verb on every resource of the rules is allowed for Relay.
func (s *Server) SetupNamespace(ns string, rules ...rbacv1.PolicyRule) {
	s.t.Helper()
	if err := s.setupNamespace(ns, rules); err != nil {
		s.t.Fatalf("kubeapi: %v", err)
	}
}

func (s *Server) setupNamespace(ns string, rules []rbacv1.PolicyRule) error {
	if len(rules) == 0 {
		rules = RelayRules()
	}
	ctx := context.Background()
	admin, err := s.client(Admin)
	if err != nil {
		return err
	}
	meta := metav1.ObjectMeta{Name: Relay, Namespace: ns}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: meta, Rules: rules}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Role: %w", err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: meta,
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: Relay},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: Relay}},
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create RoleBinding: %w", err)
	}
	// The authorizer reads Roles and bindings from an informer: wait until it has both.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, rule := range rules {
		for _, group := range rule.APIGroups {
			for _, resource := range rule.Resources {
				for _, verb := range rule.Verbs {
					if err := waitAllowed(ctx, admin, authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: group, Resource: resource}); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// waitAllowed polls a SubjectAccessReview until the authorizer allows Relay attrs.
func waitAllowed(ctx context.Context, admin kubernetes.Interface, attrs authorizationv1.ResourceAttributes) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: Relay, ResourceAttributes: &attrs}}
	for {
		got, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err == nil && got.Status.Allowed {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("Relay still may not %s %s in %s (%v)", attrs.Verb, attrs.Resource, attrs.Namespace, err)
		case <-tick.C:
		}
	}
}

// CreatePod creates, as Admin, a Pod name in ns bound to FakeNode with one container "relay"
// (image "relay"), and when podIP is not empty writes its status through the status subresource
// as a kubelet would: phase Running, status.podIP and status.podIPs podIP. It returns the Pod as
// stored.
func (s *Server) CreatePod(ns, name, podIP string) *corev1.Pod {
	s.t.Helper()
	pod, err := s.createPod(ns, name, podIP)
	if err != nil {
		s.t.Fatalf("kubeapi: %v", err)
	}
	return pod
}

func (s *Server) createPod(ns, name, podIP string) (*corev1.Pod, error) {
	ctx := context.Background()
	admin, err := s.client(Admin)
	if err != nil {
		return nil, err
	}
	pods := admin.CoreV1().Pods(ns)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/name": "relay"}},
		Spec: corev1.PodSpec{
			NodeName:   FakeNode,
			Containers: []corev1.Container{{Name: "relay", Image: "relay"}},
		},
	}
	if pod, err = pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create Pod %s/%s: %w", ns, name, err)
	}
	if podIP == "" {
		return pod, nil
	}
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: podIP, PodIPs: []corev1.PodIP{{IP: podIP}},
		HostIP: "127.0.0.1", HostIPs: []corev1.HostIP{{IP: "127.0.0.1"}},
	}
	if pod, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("set status.podIP of Pod %s/%s: %w", ns, name, err)
	}
	return pod, nil
}

// SetPodReady writes, as Admin, Pod name's Ready condition as a kubelet does: False once its
// container has died (a crash, a SIGKILL) and until it runs again, True when it runs and is
// ready. A Pod the Service stand-in selects serves only while it is not marked unready.
func (s *Server) SetPodReady(ns, name string, ready bool) {
	s.t.Helper()
	ctx := context.Background()
	admin, err := s.client(Admin)
	if err != nil {
		s.t.Fatalf("kubeapi: %v", err)
	}
	pods := admin.CoreV1().Pods(ns)
	pod, err := pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatalf("kubeapi: get Pod %s/%s: %v", ns, name, err)
	}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	cond := corev1.PodCondition{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}
	pod.Status.Conditions = slices.DeleteFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodReady })
	pod.Status.Conditions = append(pod.Status.Conditions, cond)
	if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		s.t.Fatalf("kubeapi: set Pod %s/%s ready=%v: %v", ns, name, ready, err)
	}
}
