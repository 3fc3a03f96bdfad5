package chart

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"

	"code.foss.global/serve.zone/relay/testenv/kubeapi"
)

// docs/deploy.md walks a reader from nothing to a relay in a cluster. These tests hold it to the
// chart: the example values files it quotes are quoted whole and render, and every command of
// its sh blocks that can run without a running workload is run, in order, against a real API
// server.

const deployDoc = "../../docs/deploy.md"

// examples are the values files deploy.md quotes, as `helm install` is given them.
var examples = []string{"examples/one-relay.yaml", "examples/ha.yaml"}

// fence matches a fenced block of deploy.md: its language and its body.
var fence = regexp.MustCompile("(?ms)^```([a-z]*)\n(.*?)^```$")

func readDeployDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(deployDoc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDeployExamples: deploy.md quotes each example values file whole, so the page and the
// files cannot drift; each lints strictly and renders, one relay as one Recreate replica, HA
// layered over it as two rolling replicas kept apart by the default anti-affinity.
func TestDeployExamples(t *testing.T) {
	helm := helmBinary(t)
	doc := readDeployDoc(t)
	var quoted []string
	for _, m := range fence.FindAllStringSubmatch(doc, -1) {
		if m[1] == "yaml" {
			quoted = append(quoted, m[2])
		}
	}
	for _, f := range examples {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, q := range quoted {
			found = found || q == string(b)
		}
		if !found {
			t.Errorf("docs/deploy.md does not quote %s whole in a yaml block", f)
		}
	}
	one := []string{"-f", examples[0]}
	ha := []string{"-f", examples[0], "-f", examples[1]}
	for _, args := range [][]string{one, ha} {
		if out, err := exec.Command(helm, append([]string{"lint", "--strict", "."}, args...)...).CombinedOutput(); err != nil {
			t.Errorf("helm lint --strict %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	rel := deployment(t, renderWith(t, helm, one...))
	if rel.Spec.Replicas == nil || *rel.Spec.Replicas != 1 || rel.Spec.Strategy.Type != "Recreate" {
		t.Errorf("one-relay.yaml renders %v replicas with strategy %q, want 1 with Recreate", rel.Spec.Replicas, rel.Spec.Strategy.Type)
	}
	rel = deployment(t, renderWith(t, helm, ha...))
	if rel.Spec.Replicas == nil || *rel.Spec.Replicas != 2 || rel.Spec.Strategy.Type != "RollingUpdate" {
		t.Errorf("ha.yaml renders %v replicas with strategy %q, want 2 with RollingUpdate", rel.Spec.Replicas, rel.Spec.Strategy.Type)
	}
	if a := rel.Spec.Template.Spec.Affinity; a == nil || a.PodAntiAffinity == nil {
		t.Errorf("ha.yaml renders no pod anti-affinity")
	}
}

// renderWith is `helm template relay .` in relay-system with args alone (no CI values).
func renderWith(t *testing.T, helm string, args ...string) []byte {
	t.Helper()
	args = append([]string{"template", "relay", ".", "--namespace", "relay-system", "--kube-version", strings.TrimPrefix(kubeapi.Version, "v")}, args...)
	var stderr bytes.Buffer
	cmd := exec.Command(helm, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out
}

// notRun are the commands of deploy.md the walkthrough cannot run, each with why. A command that
// is neither run nor listed here fails the test: a new line of the page must be one or the other.
var notRun = []struct{ prefix, why string }{
	{"docker ", "needs a Docker daemon and a registry"},
	{"CGO_ENABLED=0 go build -o relay ./cmd/relay", "the test builds the relay itself"},
	{"helm test ", "needs the relay's Pod running and attached"},
	{"kubectl -n relay-system get pods", "needs a kubelet"},
	{"kubectl -n relay-system logs ", "needs a kubelet"},
	{"kubectl -n relay-system port-forward ", "needs a kubelet"},
	{"kubectl delete namespace ", "the test's API server has no namespace controller to finish it"},
}

// runs are the commands the walkthrough runs, by prefix.
var runs = []string{"relay keygen ", "kubectl create ", "kubectl -n relay-system create ", "kubectl -n relay-system delete ",
	"helm lint ", "helm install ", "helm upgrade ", "helm uninstall ", "rm "}

// deployCommands are the commands of deploy.md's sh blocks, in order, continuation lines joined
// and comments dropped.
func deployCommands(doc string) []string {
	var cmds []string
	for _, m := range fence.FindAllStringSubmatch(doc, -1) {
		if m[1] != "sh" {
			continue
		}
		cur := ""
		for _, line := range strings.Split(m[2], "\n") {
			line = strings.TrimSpace(line)
			if cur == "" && (line == "" || strings.HasPrefix(line, "#")) {
				continue
			}
			if strings.HasSuffix(line, "\\") {
				cur += strings.TrimSuffix(line, "\\")
				continue
			}
			cmds = append(cmds, cur+line)
			cur = ""
		}
	}
	return cmds
}

// TestDeployWalkthrough runs docs/deploy.md's commands as a reader would, from a directory
// holding the chart (as a clone's root does) and the files the reader brings (a JWT, the relay
// origin's certificate and key), with the relay built from this tree and kubectl and helm
// pointed at a real kube-apiserver: the Secrets are created, keys written and removed, the
// release installed, upgraded to HA and uninstalled. No kubelet runs, so what needs the relay's
// Pod running is listed, not run. Without kubectl on $PATH its lines are skipped, saying so,
// and the namespace is made through the API instead.
func TestDeployWalkthrough(t *testing.T) {
	helm := helmBinary(t)
	cmds := deployCommands(readDeployDoc(t))
	s := kubeapi.Start(t)
	admin := s.Client(kubeapi.Admin)

	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	work := filepath.Join(dir, "work")
	for _, d := range []string{bin, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	charts, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(charts, filepath.Join(work, "charts")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(helm, filepath.Join(bin, "helm")); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "relay"), "./cmd/relay")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/relay: %v\n%s", err, out)
	}
	writeReaderFiles(t, work)
	_, lookErr := exec.LookPath("kubectl")
	haveKubectl := lookErr == nil
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"KUBECONFIG="+s.Kubeconfig(kubeapi.Admin), "HELM_CACHE_HOME="+filepath.Join(dir, "helm-cache"),
		"HELM_CONFIG_HOME="+filepath.Join(dir, "helm-config"), "HELM_DATA_HOME="+filepath.Join(dir, "helm-data"))

	ran := map[string]int{}
	replicas := func() int32 {
		d, err := admin.AppsV1().Deployments("relay-system").Get(context.Background(), "relay", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the release's Deployment: %v", err)
		}
		return *d.Spec.Replicas
	}
commands:
	for _, c := range cmds {
		for _, n := range notRun {
			if strings.HasPrefix(c, n.prefix) {
				t.Logf("not run (%s): %s", n.why, c)
				continue commands
			}
		}
		known := false
		for _, p := range runs {
			known = known || strings.HasPrefix(c, p)
		}
		if !known {
			t.Errorf("docs/deploy.md runs %q, which this test neither runs nor lists in notRun", c)
			continue
		}
		if strings.Contains(c, "kubectl") && !haveKubectl {
			t.Logf("not run (no kubectl on $PATH): %s", c)
			if c == "kubectl create namespace relay-system" {
				createNamespace(t, admin, "relay-system")
			}
			continue
		}
		cmd := exec.Command("sh", "-c", c)
		cmd.Dir, cmd.Env = work, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", c, err, out)
		}
		t.Logf("ran: %s", c)
		ran[strings.Fields(c)[0]]++
		switch {
		case strings.HasPrefix(c, "relay keygen --hub-key-file"):
			if !strings.Contains(string(out), "public key: ") || strings.Contains(string(out), "PRIVATE") {
				t.Errorf("%s printed %q, want the public key and nothing private", c, out)
			}
		case strings.HasPrefix(c, "helm install"):
			if got := replicas(); got != 1 {
				t.Errorf("after %s: %d replicas, want 1", c, got)
			}
		case strings.HasPrefix(c, "helm upgrade") && strings.Contains(c, "ha.yaml"):
			if got := replicas(); got != 2 {
				t.Errorf("after %s: %d replicas, want 2", c, got)
			}
		case strings.HasPrefix(c, "helm uninstall"):
			_, err := admin.AppsV1().Deployments("relay-system").Get(context.Background(), "relay", metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				t.Errorf("after %s the Deployment is still there (%v)", c, err)
			}
		}
	}
	// The page must keep walking through: keys written, the release installed, upgraded, removed.
	if ran["relay"] < 2 || ran["helm"] < 5 {
		t.Errorf("ran %v: fewer commands than the walkthrough needs (2 relay keygen, 5 helm)", ran)
	}
	if haveKubectl {
		if ran["kubectl"] < 6 {
			t.Errorf("ran %d kubectl commands, want the Secrets created, replaced and deleted", ran["kubectl"])
		}
		for _, name := range []string{"relay-cloudly-token", "relay-tls", "relay-hub-key", "relay-replication-key"} {
			if _, err := admin.CoreV1().Secrets("relay-system").Get(context.Background(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("Secret %s is still there after the walkthrough (%v)", name, err)
			}
		}
	}
	for _, f := range []string{"hub.key", "replication.key"} {
		if _, err := os.Stat(filepath.Join(work, f)); !os.IsNotExist(err) {
			t.Errorf("%s is left on disk (%v): the page removes it once it is in a Secret", f, err)
		}
	}
}

// writeReaderFiles writes what a reader brings from Cloudly: relay.jwt, and tls.crt and tls.key
// for the relay origin's host (self-signed here).
func writeReaderFiles(t *testing.T, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "relay.cluster-a.serve.zone"},
		DNSNames: []string{"relay.cluster-a.serve.zone"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(90 * 24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"relay.jwt": []byte("eyJhbGciOiJub25lIn0.eyJzdWIiOiJyZWxheSJ9.\n"),
		"tls.crt":   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"tls.key":   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// deployment is the one Deployment of a rendered chart.
func deployment(t *testing.T, rendered []byte) appsv1.Deployment {
	t.Helper()
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(rendered), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("helm template output does not read: %v", err)
		}
		if m["kind"] != "Deployment" {
			continue
		}
		var d appsv1.Deployment
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	t.Fatal("the chart renders no Deployment")
	return appsv1.Deployment{}
}
