// Package chart tests the relay's Helm chart against a real kube-apiserver (testenv/kubeapi):
// every object `helm template` renders is applied server-side, so the API server validates it
// against its schemas, and with ha.enabled the chart's ServiceAccount is shown to be allowed what
// the election calls and nothing more (SubjectAccessReviews), then used: two electors running as
// that ServiceAccount elect one, label their Pods, and hand over. test.sh holds the golden
// templates; this holds what only an API server can say.
//
// It needs the helm binary .ci/run builds ($RELAY_HELM, else the same cache path) and the
// kube-apiserver and etcd of kubeapi; without either it skips, unless RELAY_REQUIRE_KUBE=1.
package chart

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"code.foss.global/serve.zone/relay/ha"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/kubeapi"
)

// helmVersion is the helm .ci/run builds and caches.
const helmVersion = "v3.22.0"

// fieldManager owns what the test applies.
const fieldManager = "relay-chart-test"

// helmBinary is $RELAY_HELM, else .ci/run's cache path
// ${XDG_CACHE_HOME:-$HOME/.cache}/relay-ci/helm-v3.22.0/helm. Missing, the test skips naming how to
// build it, or fails under RELAY_REQUIRE_KUBE=1.
func helmBinary(t *testing.T) string {
	t.Helper()
	path := os.Getenv("RELAY_HELM")
	if path == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			cache = filepath.Join(os.Getenv("HOME"), ".cache")
		}
		path = filepath.Join(cache, "relay-ci", "helm-"+helmVersion, "helm")
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o100 != 0 {
		return path
	}
	msg := "helm " + helmVersion + " is not at " + path + "; build it as .ci/run does: GOBIN=" + filepath.Dir(path) +
		" GOFLAGS=-mod=mod go install helm.sh/helm/v3/cmd/helm@" + helmVersion + " (or set RELAY_HELM)"
	if os.Getenv("RELAY_HELM") != "" {
		msg = "RELAY_HELM=" + path + " is not an executable file"
	}
	if os.Getenv("RELAY_REQUIRE_KUBE") == "1" {
		t.Fatal(msg + " (RELAY_REQUIRE_KUBE=1: a chart left unchecked is a failure)")
	}
	t.Skip(msg)
	return ""
}

// render is `helm template relay .` in namespace ns with the golden test's values and args, as
// objects.
func render(t *testing.T, helm, ns string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	args = append([]string{"template", "relay", ".", "--namespace", ns, "--kube-version", strings.TrimPrefix(kubeapi.Version, "v"),
		"-f", "testdata/ci-values.yaml"}, args...)
	var stderr bytes.Buffer
	cmd := exec.Command(helm, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("helm template output does not read: %v", err)
		}
		if len(m) == 0 {
			continue // an empty document
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

// notServed are the kinds whose API the bare API server lacks: the Prometheus Operator's
// ServiceMonitor and PrometheusRule are custom resources of an operator the test does not install
// (test.sh checks the rule's PromQL with promtool, rules_test.go its metric names).
var notServed = map[string]bool{"monitoring.coreos.com/ServiceMonitor": true, "monitoring.coreos.com/PrometheusRule": true}

// apply applies every object server-side with strict field validation in ns, failing the test
// for each one the API server refuses, and returns the kinds applied.
func apply(t *testing.T, s *kubeapi.Server, ns string, objs []*unstructured.Unstructured) map[string]int {
	t.Helper()
	cfg := s.RESTConfig(kubeapi.Admin)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(disc)
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	applied := map[string]int{}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		what := gvk.Kind + " " + o.GetName()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) && notServed[gvk.Group+"/"+gvk.Kind] {
			t.Logf("%s: not applied, the API server does not serve %s", what, gvk.GroupVersion())
			continue
		} else if err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			if o.GetNamespace() == "" {
				o.SetNamespace(ns) // as helm install does
			}
			r = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		body, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = r.Patch(ctx, o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: fieldManager, FieldValidation: "Strict"})
		cancel()
		if err != nil {
			t.Errorf("%s: the API server refuses it: %v", what, err)
			continue
		}
		applied[gvk.Kind]++
	}
	return applied
}

func createNamespace(t *testing.T, c kubernetes.Interface, ns string) {
	t.Helper()
	if _, err := c.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
}

// TestChart applies, with HA and without, every object of the chart with every optional part on
// (hub, registry, CA Secrets, ServiceMonitor and its admin Service, dashboard, NetworkPolicy, helm
// test's Pod and Service, every pod-level value of extras-values.yaml; the PrometheusRule is
// rendered too, but the API server has no CRD for it) to one real API server, and then proves the
// HA release's Role (haRoleSuffices).
func TestChart(t *testing.T) {
	helm := helmBinary(t)
	all := []string{"--set", "grafana.dashboard.enabled=true", "--set", "cloudly.caSecret.name=relay-cloudly-ca",
		"--set", "corestoreCASecret.name=relay-corestore-ca", "-f", "testdata/extras-values.yaml",
		"--set", "prometheusRule.enabled=true"}
	haOnly := []string{"ServiceAccount", "Role", "RoleBinding", "PodDisruptionBudget"}
	plain := render(t, helm, "relay-plain", all...)
	withHA := render(t, helm, "relay-ha", append([]string{"-f", "testdata/ha-values.yaml"}, all...)...)
	rel := readRelease(t, withHA)
	s := kubeapi.Start(t)
	admin := s.Client(kubeapi.Admin)
	// extras-values.yaml's priorityClassName, which the Pods made from the template name.
	if _, err := admin.SchedulingV1().PriorityClasses().Create(context.Background(),
		&schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "relay-critical"}, Value: 1000000}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("plain", func(t *testing.T) {
		createNamespace(t, admin, "relay-plain")
		applied := apply(t, s, "relay-plain", plain)
		wantKinds(t, applied, "Deployment", "Service", "NetworkPolicy", "ConfigMap", "Pod")
		for _, kind := range haOnly {
			if applied[kind] != 0 {
				t.Errorf("without ha.enabled the chart has a %s", kind)
			}
		}
	})
	ok := t.Run("ha", func(t *testing.T) {
		createNamespace(t, admin, "relay-ha")
		applied := apply(t, s, "relay-ha", withHA)
		wantKinds(t, applied, append([]string{"Deployment", "Service", "NetworkPolicy", "ConfigMap", "Pod"}, haOnly...)...)
	})
	if !ok {
		t.FailNow() // the Role the next step proves is not there
	}
	t.Run("role", func(t *testing.T) { haRoleSuffices(t, s, "relay-ha", rel) })
}

func wantKinds(t *testing.T, applied map[string]int, kinds ...string) {
	t.Helper()
	for _, kind := range kinds {
		if applied[kind] == 0 {
			t.Errorf("no %s was applied (applied: %v)", kind, applied)
		}
	}
}

// haRelease is what the HA test reads from the rendered chart.
type haRelease struct {
	deployment     appsv1.Deployment
	service        corev1.Service
	serviceAccount string // the Pods' ServiceAccount
	lease          string // SERVEZONE_RELAY_HA_LEASE_NAME
}

func readRelease(t *testing.T, objs []*unstructured.Unstructured) haRelease {
	t.Helper()
	var rel haRelease
	for _, o := range objs {
		var into any
		switch {
		case o.GetKind() == "Deployment":
			into = &rel.deployment
		case o.GetKind() == "Service" && o.GetName() == "relay":
			into = &rel.service
		default:
			continue
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	spec := rel.deployment.Spec.Template.Spec
	rel.serviceAccount = spec.ServiceAccountName
	for _, e := range spec.Containers[0].Env {
		if e.Name == "SERVEZONE_RELAY_HA_LEASE_NAME" {
			rel.lease = e.Value
		}
	}
	if rel.serviceAccount == "" || rel.lease == "" || len(rel.service.Spec.Selector) == 0 {
		t.Fatalf("the HA render names no ServiceAccount (%q), Lease (%q) or Service selector (%v)",
			rel.serviceAccount, rel.lease, rel.service.Spec.Selector)
	}
	if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
		t.Fatal("the HA Pods do not mount their ServiceAccount's token")
	}
	return rel
}

// haRoleSuffices proves the chart's Role, applied in ns, is what the election needs: the
// ServiceAccount the Deployment's Pods run as may get, create and update the Lease and get and
// patch Pods, and nothing the relay does not call; then two electors, running as that
// ServiceAccount on Pods made from the Deployment's template, elect one, which the Service alone
// selects, and hand over.
func haRoleSuffices(t *testing.T, s *kubeapi.Server, ns string, rel haRelease) {
	admin := s.Client(kubeapi.Admin)
	user := "system:serviceaccount:" + ns + ":" + rel.serviceAccount
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	lease := func(verb, name string) authorizationv1.ResourceAttributes {
		return authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: "coordination.k8s.io", Resource: "leases", Name: name}
	}
	pod := func(verb, name string) authorizationv1.ResourceAttributes {
		return authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Resource: "pods", Name: name}
	}
	review := func(ctx context.Context, attrs authorizationv1.ResourceAttributes) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: groups, ResourceAttributes: &attrs}}
		got, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return got.Status.Allowed, nil
	}
	// What client-go's LeaseLock and the relay call (ha/elector.go, ha/replica.go). The authorizer
	// reads Roles from an informer: wait for each until it is allowed.
	for _, attrs := range []authorizationv1.ResourceAttributes{
		lease("get", rel.lease), lease("create", ""), lease("update", rel.lease),
		pod("get", "relay-7d9f-abcde"), pod("patch", "relay-7d9f-abcde"),
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		var err error
		if !await.Within(15*time.Second, func() bool { ok, e := review(ctx, attrs); err = e; return ok }) {
			t.Fatalf("%s may not %s %s %q in %s (%v)", user, attrs.Verb, attrs.Resource, attrs.Name, ns, err)
		}
		cancel()
	}
	// And no more: other Leases, other verbs, other resources, other namespaces.
	for _, attrs := range []authorizationv1.ResourceAttributes{
		lease("get", "kube-scheduler"), lease("update", "someone-else"), lease("delete", rel.lease), lease("list", ""),
		pod("list", ""), pod("watch", ""), pod("delete", "relay-7d9f-abcde"), pod("create", ""),
		{Namespace: ns, Verb: "get", Resource: "secrets", Name: "relay-replication-key"},
		{Namespace: "kube-system", Verb: "get", Group: "coordination.k8s.io", Resource: "leases", Name: rel.lease},
		{Namespace: "kube-system", Verb: "patch", Resource: "pods", Name: "relay-7d9f-abcde"},
	} {
		ok, err := review(context.Background(), attrs)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			t.Errorf("%s may %s %s %q in %s: more than the relay calls", user, attrs.Verb, attrs.Resource, attrs.Name, attrs.Namespace)
		}
	}

	// Used: a token for the ServiceAccount, as the kubelet would mount it, and two electors.
	tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), rel.serviceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token for ServiceAccount %s: %v", rel.serviceAccount, err)
	}
	sa := rest.CopyConfig(s.RESTConfig(kubeapi.Admin))
	sa.BearerToken, sa.BearerTokenFile = tr.Status.Token, ""
	client, err := kubernetes.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	rand.Read(key)
	// Both built before either runs: ha.New sets klog's global logger, which a running elector
	// reads unguarded.
	a := newElector(t, admin, client, ns, "relay-7d9f-aaaaa", rel, key)
	b := newElector(t, admin, client, ns, "relay-7d9f-bbbbb", rel, key)
	a.start(t)
	b.start(t)
	leader, standby := waitRoles(t, admin, ns, rel, a, b)
	// The standby reads the holder's Pod (pods get) and copies from its replication port.
	waitFor(t, "the standby follows the leader's replication", func() bool {
		return standby.el.Status().(ha.Status).Replication.Connected == 1
	})
	// Stepping down releases the Lease; the other relay takes it (an update of a Lease another
	// identity held) and relabels.
	leader.stop()
	if newLeader, _ := waitRoles(t, admin, ns, rel, standby); newLeader != standby {
		t.Fatalf("%s did not take over", standby.pod)
	}
}

// elector is one relay's election, as the ServiceAccount.
type elector struct {
	pod    string             // set at construction
	el     *ha.Elector        // set at construction
	cancel context.CancelFunc // set by start
	done   chan struct{}      // closed when Run has returned
}

func (e *elector) stop() { e.cancel(); <-e.done }

// newElector creates Pod name from the Deployment's template, as its ReplicaSet would, and an
// elector for it with the ServiceAccount's client and test timings in the proportions of the defaults (docs/ha.md).
func newElector(t *testing.T, admin, client kubernetes.Interface, ns, name string, rel haRelease, key []byte) *elector {
	t.Helper()
	tmpl := rel.deployment.Spec.Template
	p := &corev1.Pod{ObjectMeta: *tmpl.ObjectMeta.DeepCopy(), Spec: *tmpl.Spec.DeepCopy()}
	p.Name, p.Namespace, p.Spec.NodeName = name, ns, kubeapi.FakeNode
	ctx := context.Background()
	p, err := admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a Pod from the Deployment's template: %v", err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", PodIPs: []corev1.PodIP{{IP: "127.0.0.1"}}}
	if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	el, err := ha.New(ha.Config{LeaseName: rel.lease, Namespace: ns, Identity: name, PodName: name, PodIP: "127.0.0.1",
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 250 * time.Millisecond,
		Client: client, Replication: ln, ReplicationKey: key, Parts: []ha.Part{{Prefix: "none/", Part: nothing{}}}})
	if err != nil {
		t.Fatal(err)
	}
	return &elector{pod: name, el: el, done: make(chan struct{})}
}

// start runs the election until stop or the end of t.
func (e *elector) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() {
		defer close(e.done)
		if err := e.el.Run(ctx, func(ctx context.Context) { <-ctx.Done() }); err != nil {
			t.Errorf("%s: election: %v", e.pod, err)
		}
	}()
	t.Cleanup(e.stop)
}

// waitRoles waits until exactly one of es leads: its Pod labelled leader, every other labelled
// standby, every Pod annotated with its replication address, and the chart's Service selecting
// the leader's Pod alone.
func waitRoles(t *testing.T, admin kubernetes.Interface, ns string, rel haRelease, es ...*elector) (leader, standby *elector) {
	t.Helper()
	sel := labels.SelectorFromSet(rel.service.Spec.Selector)
	var last string
	ok := poll(20*time.Second, func() bool {
		leader, standby, last = nil, nil, ""
		for _, e := range es {
			p, err := admin.CoreV1().Pods(ns).Get(context.Background(), e.pod, metav1.GetOptions{})
			if err != nil {
				last = err.Error()
				return false
			}
			role := p.Labels[ha.RoleLabel]
			last += e.pod + "=" + role + " "
			if p.Annotations[ha.ReplicationAnnotation] == "" {
				return false
			}
			if sel.Matches(labels.Set(p.Labels)) != (role == ha.RoleLeader) {
				t.Fatalf("the Service's selector %v and the Pod %s labelled %q disagree", sel, e.pod, role)
			}
			switch {
			case role == ha.RoleLeader && leader == nil:
				leader = e
			case role == ha.RoleStandby:
				standby = e
			default:
				return false
			}
		}
		return leader != nil && (len(es) == 1 || standby != nil)
	})
	if !ok {
		t.Fatalf("no single leader among the Pods: %s", last)
	}
	return leader, standby
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !poll(20*time.Second, cond) {
		t.Fatalf("%s: not within 20s", what)
	}
}

// poll reports whether cond held within d: it waits on another process (the API server) and the
// election's own timers, so there is no event to wait on instead.
func poll(d time.Duration, cond func() bool) bool { return await.Within(d, cond) }

// nothing is a replicated part with no records: enough for a standby to follow the leader.
type nothing struct{}

func (nothing) Replicate(func(string, []byte)) func() { return func() {} }
func (nothing) Adopt(string, []byte) error            { return nil }
func (nothing) ForgetCopy()                           {}
