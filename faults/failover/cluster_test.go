// Package failover runs several relays per cluster (docs/ha.md) as real processes: the built relay
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
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/kubeapi"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// Short election timings for tests, in docs/ha.md's proportions (defaults 6 s, 4 s, 500 ms): the
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
	t          testing.TB
	kube       *kubeapi.Server
	cloudly    *sim.Cloudly
	svc        *kubeapi.Service
	bin        string               // the relay binary
	dir        string               // token, replication key
	token      string               // file holding Cloudly's machine JWT
	key        string               // the replicas' replication key file
	admin      kubernetes.Interface // the cluster's administrator: Pod objects, as the ReplicaSet
	kubeconfig string               // the relays' kubeconfig, as their service account
	hubKey     string               // the replicas' VPN hub key file; "": the relays run no hub (vpn_test.go)

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
	c.admin, c.kubeconfig = kube.Client(kubeapi.Admin), kube.Kubeconfig(kubeapi.Relay)
	c.svc = startService(t, c.admin, namespace)
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

// relayProc is one Pod's relay container, as its kubelet runs it: a process, started again — a
// new process, the same Pod — when one exits 0 after its term ended (the relay exits so, to come
// back a standby with registrationSequence 0), as restartPolicy Always does. A process the test
// ended (SIGTERM, SIGKILL) is not started again; one that exits otherwise is a crash, and fails
// the test.
type relayProc struct {
	name  string   // the Pod's name, the relay's identity in the Lease
	c     *cluster // set at construction
	extra []string // set at construction: flags added to every process of the container

	mu       sync.Mutex
	cur      *process    // guarded by mu: the container's current (or last) process
	ended    bool        // guarded by mu: the test ended the container: no restart
	restarts int         // guarded by mu: processes started after one exited at the end of its term
	frozen   atomic.Bool // the current process is stopped (freeze): its admin listener answers nothing
	crashes  []string    // guarded by mu: processes that exited, not ended by the test, other than after their term
	tail     []string    // guarded by mu: the last lines the relay wrote, across its processes
}

// process is one relay process. Its addresses are the ones it bound on port 0 and logged.
type process struct {
	cmd           *exec.Cmd     // set at construction
	bound         chan struct{} // closed once the relay logged its bound addresses (or exited)
	listen, admin string        // written before bound is closed: downstream and admin, host:port
	hub           string        // written before bound is closed: the VPN hub's UDP address; "": no hub
	termEnded     atomic.Bool   // the relay logged that its term ended and it exits
	exited        chan struct{} // closed when the process has exited; exitErr is then set
	exitErr       error
}

// termEndedLine is how the relay says it exits at the end of its term.
const termEndedLine = "the term ended: exiting"

// start creates Pod name (as the ReplicaSet would), runs a relay in it (with extra flags, if
// any) and waits until its /readyz answers 200: listeners bound, the API reachable, ready to lead.
func (c *cluster) start(name string, extra ...string) *relayProc {
	c.t.Helper()
	c.kube.CreatePod(namespace, name, "127.0.0.1")
	p := &relayProc{name: name, c: c, extra: extra}
	pr, err := p.spawn()
	if err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.relays[name] = p
	c.mu.Unlock()
	c.eventually(name+" ready (/readyz 200)", 30*time.Second, func() bool {
		if pr.hasExited() {
			c.t.Fatalf("relay %s exited at start (%v):\n%s", name, pr.exitErr, p.lastLines())
		}
		return p.ready()
	})
	return p
}

// spawn starts a relay process in the Pod, on port 0 everywhere, waits until it has logged the
// addresses it bound, and annotates the Pod with its downstream address for the Service stand-in
// (in a cluster, podIP:targetPort). It runs on the test's goroutine at start, and on the
// exit-watching goroutine of the previous process for a restart, so it returns errors.
func (p *relayProc) spawn() (*process, error) {
	c := p.c
	pr := &process{bound: make(chan struct{}), exited: make(chan struct{})}
	pr.cmd = exec.Command(c.bin, "run", "--cluster-id", c.cloudly.ClusterID, "--node-id", p.name,
		"--cloudly-url", c.cloudly.URL(), "--cloudly-token-file", c.token, "--insecure-plaintext",
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--advertise-address", "192.0.2.1", "--log-level", "info",
		"--ha-lease-name", leaseName, "--ha-lease-namespace", namespace,
		"--ha-lease-duration", leaseDuration.String(), "--ha-renew-deadline", renewDeadline.String(), "--ha-retry-period", retryPeriod.String(),
		"--kubeconfig", c.kubeconfig, "--ha-replication-listen", "127.0.0.1:0", "--ha-replication-key-file", c.key)
	pr.cmd.Args = append(pr.cmd.Args, c.hubArgs()...)
	pr.cmd.Args = append(pr.cmd.Args, p.extra...)
	// The downward API of the chart's Pod template (docs/ha.md).
	pr.cmd.Env = append(os.Environ(), "POD_NAME="+p.name, "POD_NAMESPACE="+namespace, "POD_IP=127.0.0.1")
	stderr, err := pr.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.ended {
		p.mu.Unlock()
		return nil, fmt.Errorf("relay %s: the container was ended", p.name)
	}
	err = pr.cmd.Start()
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	read := make(chan struct{})
	go func() { defer close(read); p.readStderr(pr, stderr) }()
	go func() {
		<-read // Wait closes the pipe: read it to the end first
		pr.exitErr = pr.cmd.Wait()
		close(pr.exited)
		p.exited(pr)
	}()
	select {
	case <-pr.bound:
	case <-pr.exited:
	}
	// The process is the container's from here: the test reads its addresses.
	p.mu.Lock()
	ended := p.ended
	if !ended {
		p.cur = pr
	}
	p.mu.Unlock()
	if ended {
		pr.cmd.Process.Kill()
		<-pr.exited
		return nil, fmt.Errorf("relay %s: the container was ended", p.name)
	}
	if pr.listen == "" {
		<-pr.exited
		return pr, fmt.Errorf("relay %s exited before it bound its listeners (%v):\n%s", p.name, pr.exitErr, p.lastLines())
	}
	// In a cluster the Service reaches podIP:targetPort, which needs no API; here the address is
	// an annotation, written once the API answers (a restart may come while it is away).
	annotations := map[string]string{downstreamAnnotation: pr.listen}
	if pr.hub != "" {
		annotations[hubAnnotation] = pr.hub
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := c.admin.CoreV1().Pods(namespace).Patch(ctx, p.name, types.MergePatchType, patch, metav1.PatchOptions{})
		cancel()
		if err == nil || pr.hasExited() {
			return pr, nil
		}
		select {
		case <-pr.exited:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// exited plays the kubelet once pr has exited: a process that ended its term is started again,
// one the test did not end and that did not end its term is recorded as a crash.
func (p *relayProc) exited(pr *process) {
	p.mu.Lock()
	ended := p.ended
	termEnded := pr.exitErr == nil && pr.termEnded.Load()
	if !ended && !termEnded {
		p.crashes = append(p.crashes, fmt.Sprintf("exit %v", pr.exitErr))
	}
	if !ended && termEnded {
		p.restarts++
		p.tail = append(p.tail, "--- the kubelet starts the container again ---")
	}
	p.mu.Unlock()
	if ended || !termEnded {
		return
	}
	if _, err := p.spawn(); err != nil {
		p.mu.Lock()
		if !p.ended {
			p.crashes = append(p.crashes, "restart: "+err.Error())
		}
		p.mu.Unlock()
	}
}

// current is the container's current process.
func (p *relayProc) current() *process {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// restartCount is how many times the container was started again after a term ended.
func (p *relayProc) restartCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts
}

// end marks the container ended by the test and returns its current process.
func (p *relayProc) end() *process {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ended = true
	return p.cur
}

// stopAll kills every relay still running, and reports the crashes.
func (c *cluster) stopAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.relays {
		if pr := p.end(); pr != nil && !pr.hasExited() {
			pr.cmd.Process.Kill()
			<-pr.exited
		}
		p.mu.Lock()
		for _, crash := range p.crashes {
			c.t.Errorf("relay %s crashed: %s", p.name, crash)
		}
		p.mu.Unlock()
	}
}

// running is every relay whose process runs now, by name.
func (c *cluster) running() []*relayProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*relayProc
	for _, p := range c.relays {
		if pr := p.current(); pr != nil && !pr.hasExited() {
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
		if p.frozen.Load() {
			continue
		}
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
	Parts []struct {
		Name   string `json:"name"`
		Status struct {
			Runs int `json:"runs"` // the escrow's held runs
		} `json:"status"`
	} `json:"parts"`
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
	resp, err := adminClient.Get("http://" + p.current().admin + "/status.json")
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
	resp, err := adminClient.Get("http://" + p.current().admin + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// terminate sends SIGTERM, as the kubelet does on a rolling update, and waits (10 s at most) for
// the exit; nil is exit status 0.
func (p *relayProc) terminate() error {
	pr := p.end()
	pr.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-pr.exited:
		return pr.exitErr
	case <-time.After(10 * time.Second):
		pr.cmd.Process.Kill()
		<-pr.exited
		return fmt.Errorf("relay %s: no exit within 10 s of SIGTERM", p.name)
	}
}

// kill ends the process with SIGKILL: a crash, an OOM kill, a lost node.
func (p *relayProc) kill() {
	pr := p.end()
	pr.cmd.Process.Kill()
	<-pr.exited
}

// freeze stops the relay's process with SIGSTOP — a long pause, a frozen VM — and tells Cloudly,
// which then judges what the process sends once resumed rather than its open socket.
func (p *relayProc) freeze() {
	p.c.t.Helper()
	if err := p.current().cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		p.c.t.Fatalf("SIGSTOP %s: %v", p.name, err)
	}
	p.frozen.Store(true)
	p.c.cloudly.SetRelayStopped(p.name, true)
}

// thaw resumes the process freeze stopped (SIGCONT).
func (p *relayProc) thaw() {
	p.c.t.Helper()
	p.c.cloudly.SetRelayStopped(p.name, false)
	if err := p.current().cmd.Process.Signal(syscall.SIGCONT); err != nil {
		p.c.t.Fatalf("SIGCONT %s: %v", p.name, err)
	}
	p.frozen.Store(false)
}

func (pr *process) hasExited() bool {
	select {
	case <-pr.exited:
		return true
	default:
		return false
	}
}

// readStderr keeps the process's last lines, and notes the addresses it bound and the end of its
// term.
func (p *relayProc) readStderr(pr *process, r io.Reader) {
	defer func() {
		select {
		case <-pr.bound:
		default:
			close(pr.bound)
		}
	}()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var l struct {
			Message, Listen, Admin, Hub string
		}
		if pr.listen == "" && json.Unmarshal([]byte(line), &l) == nil && l.Message == "relay starting" && l.Listen != "" && l.Admin != "" {
			pr.listen, pr.admin, pr.hub = l.Listen, l.Admin, l.Hub
			close(pr.bound)
		}
		if strings.Contains(line, termEndedLine) {
			pr.termEnded.Store(true)
		}
		p.mu.Lock()
		if p.tail = append(p.tail, line); len(p.tail) > 80 {
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
