package chart

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"code.foss.global/serve.zone/relay/ha"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
)

// helmTest is what `helm test` creates from a render, and the objects it must reach or avoid.
type helmTest struct {
	pod        corev1.Pod
	service    corev1.Service // the test's own, on the admin port
	deployment appsv1.Deployment
	relaySvc   corev1.Service // the relay's Service
	policy     *networkingv1.NetworkPolicy
}

func readHelmTest(t *testing.T, objs []*unstructured.Unstructured) helmTest {
	t.Helper()
	var h helmTest
	var pods, services int
	for _, o := range objs {
		var into any
		hook := o.GetAnnotations()["helm.sh/hook"] == "test"
		switch {
		case o.GetKind() == "Pod" && hook:
			into, pods = &h.pod, pods+1
		case o.GetKind() == "Service" && hook:
			into, services = &h.service, services+1
		case o.GetKind() == "Pod" || hook:
			t.Fatalf("%s %s: a Pod outside the test, or a test hook that is neither its Pod nor its Service", o.GetKind(), o.GetName())
		case o.GetKind() == "Deployment":
			into = &h.deployment
		case o.GetKind() == "Service" && o.GetName() == "relay":
			into = &h.relaySvc
		case o.GetKind() == "NetworkPolicy":
			h.policy = &networkingv1.NetworkPolicy{}
			into = h.policy
		default:
			continue
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	if pods != 1 || services != 1 {
		t.Fatalf("the render has %d test Pods and %d test Services: want one of each", pods, services)
	}
	return h
}

func selects(t *testing.T, sel *metav1.LabelSelector, set map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatal(err)
	}
	return s.Matches(labels.Set(set))
}

// TestHelmTestReachesTheRelay: the test's Pod is labelled apart from the relay (no Deployment,
// Service or budget counts it), its Service selects the relay Pods on the admin port (with HA only
// the leader's), and the NetworkPolicy admits that Pod, and nothing new besides, to the admin port.
func TestHelmTestReachesTheRelay(t *testing.T) {
	helm := helmBinary(t)
	for _, c := range []struct {
		name string
		args []string
	}{{"plain", nil}, {"ha", []string{"-f", "testdata/ha-values.yaml"}}} {
		t.Run(c.name, func(t *testing.T) {
			h := readHelmTest(t, render(t, helm, "relay-system", c.args...))
			relayPod := h.deployment.Spec.Template.Labels
			if selects(t, h.deployment.Spec.Selector, h.pod.Labels) {
				t.Errorf("the Deployment's selector %v takes the test's Pod %v: its ReplicaSet would adopt it", h.deployment.Spec.Selector, h.pod.Labels)
			}
			if labels.SelectorFromSet(h.relaySvc.Spec.Selector).Matches(labels.Set(h.pod.Labels)) {
				t.Errorf("the relay's Service selects the test's Pod")
			}
			leader := maps(relayPod, map[string]string{ha.RoleLabel: ha.RoleLeader})
			standby := maps(relayPod, map[string]string{ha.RoleLabel: ha.RoleStandby})
			sel := labels.SelectorFromSet(h.service.Spec.Selector)
			if !sel.Matches(labels.Set(leader)) {
				t.Errorf("the test's Service %v does not select the relay's Pod %v", sel, leader)
			}
			if isHA := c.name == "ha"; sel.Matches(labels.Set(standby)) == isHA {
				t.Errorf("with ha %v the test's Service selects a standby: %v", isHA, sel.Matches(labels.Set(standby)))
			}
			if len(h.service.Spec.Ports) != 1 || h.service.Spec.Ports[0].TargetPort.StrVal != "admin" || h.service.Spec.Ports[0].Port != 9464 {
				t.Errorf("the test's Service ports %+v: want 9464 to the container port admin", h.service.Spec.Ports)
			}
			env := map[string]string{}
			for _, e := range h.pod.Spec.Containers[0].Env {
				env[e.Name] = e.Value
			}
			if want := h.service.Name + ".relay-system.svc"; env["RELAY_ADMIN_HOST"] != want || env["RELAY_ADMIN_PORT"] != "9464" {
				t.Errorf("the test asks %s:%s, want %s:9464", env["RELAY_ADMIN_HOST"], env["RELAY_ADMIN_PORT"], want)
			}

			p := h.policy
			if p == nil || !selects(t, &p.Spec.PodSelector, relayPod) {
				t.Fatalf("no NetworkPolicy selects the relay's Pod")
			}
			admitted := false
			for _, rule := range p.Spec.Ingress {
				admin := false
				for _, port := range rule.Ports {
					admin = admin || port.Port.StrVal == "admin"
				}
				for _, from := range rule.From {
					if from.PodSelector != nil && from.NamespaceSelector == nil && selects(t, from.PodSelector, h.pod.Labels) {
						admitted = admitted || admin
						if selects(t, from.PodSelector, map[string]string{"app.kubernetes.io/instance": "relay"}) {
							t.Errorf("the rule admitting the test's Pod admits any Pod of the release: %v", from.PodSelector)
						}
					}
				}
			}
			if !admitted {
				t.Errorf("the NetworkPolicy admits the test's Pod %v to no admin port", h.pod.Labels)
			}
		})
	}
}

func maps(a, b map[string]string) map[string]string {
	m := map[string]string{}
	for k, v := range a {
		m[k] = v
	}
	for k, v := range b {
		m[k] = v
	}
	return m
}

// busybox is the busybox binary, to run the test's script with the tools its image has; missing,
// the test skips, or fails under RELAY_REQUIRE_KUBE=1.
func busybox(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("busybox")
	if err == nil {
		return path
	}
	msg := "busybox is not installed (apt-get install busybox): the helm test's script was not run"
	if os.Getenv("RELAY_REQUIRE_KUBE") == "1" {
		t.Fatal(msg + " (RELAY_REQUIRE_KUBE=1: a chart left unchecked is a failure)")
	}
	t.Skip(msg)
	return ""
}

// TestHelmTestScript runs the test Pod's own command, as rendered, under busybox with nothing on
// PATH but busybox's applets (the tools the test image has), against a real relay's admin
// listener: it passes once the relay is attached, printing its answer, and fails naming the
// relay's reason when the relay is detached from Cloudly.
func TestHelmTestScript(t *testing.T) {
	helm := helmBinary(t)
	bb := busybox(t)
	h := readHelmTest(t, render(t, helm, "relay-system"))
	cmd := h.pod.Spec.Containers[0].Command
	if len(cmd) != 3 || cmd[0] != "sh" || cmd[1] != "-c" {
		t.Fatalf("the test Pod's command is %q: want sh -c <script>", cmd)
	}
	bin := t.TempDir()
	for _, applet := range []string{"sh", "nc", "date", "sed", "head", "tr", "sleep"} {
		if err := os.Symlink(bb, filepath.Join(bin, applet)); err != nil {
			t.Fatal(err)
		}
	}
	e := relaytest.Start(t, relaytest.Options{})
	run := func(within int) (string, string, error) {
		host, port, _ := strings.Cut(e.Relay.AdminAddr().String(), ":")
		c := exec.Command(filepath.Join(bin, "sh"), "-c", cmd[2])
		c.Env = []string{"PATH=" + bin, "RELAY_ADMIN_HOST=" + host, "RELAY_ADMIN_PORT=" + port, "READY_WITHIN=" + strconv.Itoa(within)}
		var stdout, stderr bytes.Buffer
		c.Stdout, c.Stderr = &stdout, &stderr
		err := c.Run()
		return stdout.String(), stderr.String(), err
	}

	out, errOut, err := run(30)
	if err != nil || !strings.Contains(out, "relay /readyz: ready") {
		t.Fatalf("against an attached relay the test failed (%v): stdout %q, stderr %q", err, out, errOut)
	}

	e.Cloudly.SetAvailable(false)
	e.Cloudly.Drop()
	e.Eventually("relay detached", func() bool { return !e.Relay.Upstream().Attached() })
	out, errOut, err = run(1)
	if err == nil {
		t.Fatalf("against a detached relay the test passed: stdout %q", out)
	}
	if !strings.Contains(errOut, "did not answer 200 within 1s") || !strings.Contains(errOut, "not ready: detached") {
		t.Fatalf("against a detached relay the test failed without the relay's reason: stdout %q, stderr %q", out, errOut)
	}
}
