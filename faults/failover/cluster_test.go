// Package failover runs several relays per cluster (SPEC §16) as real processes: the built relay
// binary with --ha-lease-name, against a real kube-apiserver and etcd (testenv/kubeapi),
// the simulated Cloudly and nodes, and a stand-in for the chart's Service that forwards each new
// connection to the Pod labelled relay.serve.zone/role=leader. The Cloudly stand-in fails the
// test when two relays are ever attached at once.
//
//	go test ./faults/failover/                          # skips without the kube binaries
//	bash testenv/kubeapi/build.sh              # builds and caches them once
//	RELAY_REQUIRE_KUBE=1 go test ./faults/failover/     # CI: missing binaries are a failure
//	go test -run '^$' -bench HA -benchtime 1x ./faults/failover/   # the figures of bench/RESULTS.md
//
// No kubelet runs: the test creates the Pod objects and plays the ReplicaSet (a new Pod, its
// relay started, an old one stopped and deleted), and each relay labels its own Pod through the
// API as in a cluster.
package failover

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/kubeapi"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// Short election timings for tests, in SPEC §16's proportions (defaults 6 s, 4 s, 500 ms): the
// renew deadline well inside the lease, several retries inside the renew deadline.
const (
	leaseDuration = 4 * time.Second
	renewDeadline = 2 * time.Second
	retryPeriod   = 500 * time.Millisecond
)

// Where the test keeps things the relays do not: the namespace, the Lease, and the annotation
// naming a Pod's downstream address for the Service stand-in (in a cluster, podIP:targetPort).
const (
	namespace            = "relay-ha"
	leaseName            = "relay"
	downstreamAnnotation = "failover.test/downstream"
	roleLabel            = "relay.serve.zone/role" // ha.RoleLabel, spelled out: this package imports no product package
)

// cluster is one simulated Kubernetes cluster's relays: the API server, Cloudly, the Service
// stand-in, the relay processes and their Pods.
type cluster struct {
	t       testing.TB
	kube    *kubeapi.Server
	cloudly *sim.Cloudly
	svc     *kubeapi.Service
	bin     string // the relay binary
	dir     string // token, replication key
	token   string // file holding Cloudly's machine JWT
	key     string // the replicas' replication key file

	mu     sync.Mutex
	relays map[string]*relayProc // guarded by mu: by Pod name, every relay started (running or not)
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
	buildDir  string
)

// relayBinary builds cmd/relay once per test binary.
func relayBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "relay-failover-")
		if buildErr != nil {
			return
		}
		builtBin = filepath.Join(buildDir, "relay")
		out, err := exec.Command("go", "build", "-o", builtBin, "../../cmd/relay").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// newCluster starts the API server (or skips, naming the build command, when its binaries are
// missing), Cloudly and the Service stand-in, and writes the files every relay shares. At the
// end of the test it checks Cloudly's judgement: never two relays attached at once, nothing sent
// out of Cloudly's order.
func newCluster(t testing.TB) *cluster {
	t.Helper()
	kubeapi.Require(t)
	bin := relayBinary(t)
	kube := kubeapi.Start(t)
	kube.SetupNamespace(namespace)
	cloudly, err := sim.NewCloudly(zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, kube: kube, cloudly: cloudly, bin: bin, dir: t.TempDir(), relays: map[string]*relayProc{}}
	c.token = filepath.Join(c.dir, "jwt")
	if err := os.WriteFile(c.token, []byte(cloudly.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	c.key = filepath.Join(c.dir, "replication.key")
	if out, err := exec.Command(bin, "keygen", "--replication-key-file", c.key).CombinedOutput(); err != nil {
		t.Fatalf("relay keygen --replication-key-file: %v\n%s", err, out)
	}
	c.svc = startService(t, kube.Client(kubeapi.Admin), namespace)
	t.Cleanup(func() {
		c.stopAll()
		cloudly.Close()
		if n := cloudly.TwoAttached(); n != 0 {
			t.Errorf("Cloudly saw two relays attached at once %d times", n)
		}
		for _, v := range cloudly.Violations() {
			t.Errorf("Cloudly: %s", v)
		}
		if t.Failed() {
			c.mu.Lock()
			for name, p := range c.relays {
				t.Logf("relay %s wrote, last:\n%s", name, p.lastLines())
			}
			c.mu.Unlock()
		}
	})
	return c
}

// relayProc is one relay process and its Pod.
type relayProc struct {
	name                string // the Pod's name, the relay's identity in the Lease
	listen, admin, repl string // loopback addresses: downstream, admin, replication
	cmd                 *exec.Cmd
	exited              chan struct{} // closed when the process has exited; exitErr is then set
	exitErr             error

	mu   sync.Mutex
	tail []string // guarded by mu: the last lines the relay wrote
}

// start creates Pod name (as the ReplicaSet would), runs a relay in it (with extra flags, if
// any) and waits until its /readyz answers 200: listeners bound, the API reachable, ready to lead.
func (c *cluster) start(name string, extra ...string) *relayProc {
	c.t.Helper()
	p := &relayProc{name: name, listen: freePort(c.t), admin: freePort(c.t), repl: freePort(c.t), exited: make(chan struct{})}
	c.kube.CreatePod(namespace, name, "127.0.0.1")
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{downstreamAnnotation: p.listen}}})
	if _, err := c.kube.Client(kubeapi.Admin).CoreV1().Pods(namespace).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		c.t.Fatalf("annotate Pod %s: %v", name, err)
	}
	p.cmd = exec.Command(c.bin, "run", "--cluster-id", c.cloudly.ClusterID, "--node-id", name,
		"--cloudly-url", c.cloudly.URL(), "--cloudly-token-file", c.token, "--insecure-plaintext",
		"--listen", p.listen, "--admin-listen", p.admin, "--advertise-address", "192.0.2.1", "--log-level", "info",
		"--ha-lease-name", leaseName, "--ha-lease-namespace", namespace,
		"--ha-lease-duration", leaseDuration.String(), "--ha-renew-deadline", renewDeadline.String(), "--ha-retry-period", retryPeriod.String(),
		"--kubeconfig", c.kube.Kubeconfig(kubeapi.Relay), "--ha-replication-listen", p.repl, "--ha-replication-key-file", c.key)
	p.cmd.Args = append(p.cmd.Args, extra...)
	// The downward API of the chart's Pod template (SPEC §16).
	p.cmd.Env = append(os.Environ(), "POD_NAME="+name, "POD_NAMESPACE="+namespace, "POD_IP=127.0.0.1")
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	read := make(chan struct{})
	go func() { defer close(read); p.readStderr(stderr) }()
	go func() {
		<-read // Wait closes the pipe: read it to the end first
		p.exitErr = p.cmd.Wait()
		close(p.exited)
	}()
	c.mu.Lock()
	c.relays[name] = p
	c.mu.Unlock()
	c.eventually(name+" ready (/readyz 200)", 30*time.Second, func() bool {
		if p.hasExited() {
			c.t.Fatalf("relay %s exited at start (%v):\n%s", name, p.exitErr, p.lastLines())
		}
		return p.ready()
	})
	return p
}

// stopAll kills every relay still running.
func (c *cluster) stopAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.relays {
		if !p.hasExited() {
			p.cmd.Process.Kill()
			<-p.exited
		}
	}
}

// running is every relay whose process still runs, by name.
func (c *cluster) running() []*relayProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*relayProc
	for _, p := range c.relays {
		if !p.hasExited() {
			out = append(out, p)
		}
	}
	return out
}

// deletePod deletes a stopped relay's Pod at once, as the ReplicaSet does once its container
// has ended (no kubelet here to finish a graceful deletion).
func (c *cluster) deletePod(name string) {
	c.t.Helper()
	zero := int64(0)
	if err := c.kube.Client(kubeapi.Admin).CoreV1().Pods(namespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		c.t.Fatalf("delete Pod %s: %v", name, err)
	}
}

// podRoles is each Pod's role label, as the API server has it.
func (c *cluster) podRoles() (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	list, err := c.kube.Client(kubeapi.Admin).CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range list.Items {
		out[p.Name] = p.Labels[roleLabel]
	}
	return out, nil
}

// leader is the running relay that says it leads and is attached to Cloudly, when exactly one
// does; nil otherwise.
func (c *cluster) leader() *relayProc {
	var found []*relayProc
	for _, p := range c.running() {
		if st, err := p.status(); err == nil && st.HA.Role == "leader" && st.Cloudly.Attached {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		return nil
	}
	return found[0]
}

// waitLeader waits until one running relay leads, attached, its Pod alone labelled leader, and
// Cloudly holds exactly one attached socket.
func (c *cluster) waitLeader(d time.Duration) *relayProc {
	c.t.Helper()
	var l *relayProc
	c.eventually("one relay leading, attached, its Pod alone labelled leader", d, func() bool {
		if l = c.leader(); l == nil || c.cloudly.AttachedSockets() != 1 {
			return false
		}
		roles, err := c.podRoles()
		if err != nil {
			return false
		}
		for name, role := range roles {
			if (role == "leader") != (name == l.name) {
				return false
			}
		}
		return true
	})
	return l
}

// eventually polls cond every 20 ms until it holds, failing the test after d. It waits for an
// event other processes own (a relay's status, the API's objects), for which there is no signal.
func (c *cluster) eventually(what string, d time.Duration, cond func() bool) {
	c.t.Helper()
	if !poll(d, cond) {
		c.t.Fatalf("timed out after %s waiting for: %s", d, what)
	}
}

// poll is eventually without the failure: whether cond held within d.
func poll(d time.Duration, cond func() bool) bool { return await.Within(d, cond) }

// relayStatus is the part of /status.json these tests read.
type relayStatus struct {
	Cloudly struct {
		Attached bool `json:"attached"`
	} `json:"cloudly"`
	HA struct {
		Role        string `json:"role"`
		Holder      string `json:"holder"`
		Replication struct {
			Connected int  `json:"connected"`
			Runs      int  `json:"runs"`
			Complete  bool `json:"complete"`
		} `json:"replication"`
	} `json:"ha"`
}

var adminClient = &http.Client{Timeout: 2 * time.Second}

func (p *relayProc) status() (relayStatus, error) {
	var st relayStatus
	resp, err := adminClient.Get("http://" + p.admin + "/status.json")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("/status.json answered %d", resp.StatusCode)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

func (p *relayProc) ready() bool {
	resp, err := adminClient.Get("http://" + p.admin + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// terminate sends SIGTERM, as the kubelet does on a rolling update, and waits (10 s at most) for
// the exit; nil is exit status 0.
func (p *relayProc) terminate() error {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.exitErr
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("relay %s: no exit within 10 s of SIGTERM", p.name)
	}
}

// kill ends the process with SIGKILL: a crash, an OOM kill, a lost node.
func (p *relayProc) kill() {
	p.cmd.Process.Kill()
	<-p.exited
}

func (p *relayProc) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

func (p *relayProc) readStderr(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		p.mu.Lock()
		if p.tail = append(p.tail, sc.Text()); len(p.tail) > 60 {
			p.tail = p.tail[1:]
		}
		p.mu.Unlock()
	}
}

func (p *relayProc) lastLines() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
