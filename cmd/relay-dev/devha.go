package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"code.foss.global/serve.zone/relay/daemon"
	"code.foss.global/serve.zone/relay/ha"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/kubeapi"
	"code.foss.global/serve.zone/relay/testenv/sim"
	"code.foss.global/serve.zone/relay/vpnhub"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// `relay-dev --replicas N` (docs/ha.md): N relays in this process, one elected through a Lease on a
// real kube-apiserver and etcd (testenv/kubeapi, from the cached binaries), each with its
// own Pod object; the simulated nodes reach the leader through a stand-in for the chart's Service
// that watches the Pods' role label; and every devHAHandoverEvery the leader steps down as on
// SIGTERM, another takes over, the nodes come back through the Service, and the stepped-down
// relay starts again as a standby, as a Pod's container restarts. A relay whose term ends
// otherwise (it fenced: the Lease lost) exits as in a Pod, and is started again at once, a
// standby, as the kubelet restarts an exited container.
//
//	start:     API server → namespace, Role → Pods relay-0… → relays (standby) → Service → nodes
//	handover:  leader shuts down (SIGTERM's path) → Lease released → a standby leads → nodes
//	           re-register through the Service → the old Pod's relay starts again, a standby

// devHAHandoverEvery is how often the script hands the leadership over; tests shorten it.
var devHAHandoverEvery = 30 * time.Second

// The dev cluster's Kubernetes names.
const (
	devHANamespace = "relay-dev"
	devHALease     = "relay"
)

// devHAMaxReplicas bounds --replicas: every replica is a relay in this process.
const devHAMaxReplicas = 5

// cmdDevHA is `relay-dev --replicas N` for N > 1, until ctx ends; log is the relays' logger.
func cmdDevHA(ctx context.Context, replicas, nodes int, log zerolog.Logger, logLevel string, stdout io.Writer) error {
	if replicas < 2 || replicas > devHAMaxReplicas {
		return daemon.Usagef("--replicas: must be from 1 to %d", devHAMaxReplicas)
	}
	if dir, ok := kubeapi.Binaries(); !ok {
		return daemon.Usagef("--replicas %d needs kube-apiserver and etcd, which are not built in %s; build them once with: %s",
			replicas, dir, kubeapi.BuildCommand)
	}
	start := time.Now()
	var mu sync.Mutex // one line at a time on stdout
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(stdout, "[%4.0fs] "+format+"\n", append([]any{time.Since(start).Seconds()}, args...)...)
	}
	c, err := startDevCluster(replicas, log, logLevel)
	if err != nil {
		return err
	}
	defer c.close()
	fmt.Fprintf(stdout, "relay-dev: %d relays, one elected through the Lease %s/%s on a test kube-apiserver at %s; "+
		"%d simulated nodes reach the leader through a Service stand-in on %s (the leader's VPN hub on udp %s); Cloudly stand-in on %s\n",
		replicas, devHANamespace, devHALease, c.kube.URL(), nodes, strings.TrimSuffix(strings.TrimPrefix(c.svc.URL(), "ws://"), "/"),
		c.svc.UDPAddr(), c.cloudly.URL())
	for _, r := range c.replicas() {
		fmt.Fprintf(stdout, "relay-dev: %s: downstream %s, VPN hub udp %s, status page http://%s/status\n", r.name, r.relay.DownstreamAddr(),
			r.hub.Addr(), r.relay.AdminAddr())
	}
	fmt.Fprintf(stdout, "relay-dev: every %s the script has the leader step down as on SIGTERM; another relay takes over, "+
		"the nodes register again through the Service, and the old one starts again as a standby\n", devHAHandoverEvery)

	f := startDevFleet(c.svc.URL(), nodes, log)
	defer f.close()
	scriptDone := make(chan struct{})
	go func() { defer close(scriptDone); c.script(ctx, f, say) }()

	status := time.NewTicker(time.Second)
	defer status.Stop()
	for {
		select {
		case <-ctx.Done():
			<-scriptDone
			f.close()
			mu.Lock()
			fmt.Fprintln(stdout, c.summary(f))
			mu.Unlock()
			return nil
		case <-status.C:
			say("%s leader=%s attached=%v", c.summary(f), leaderNames(c.svc), c.cloudly.Attached())
		}
	}
}

// devCluster is the dev command's cluster: the API server, Cloudly, the Service stand-in and
// the relays, one per Pod.
type devCluster struct {
	kube     *kubeapi.Process     // set at construction
	cloudly  *sim.Cloudly         // set at construction
	svc      *kubeapi.Service     // set at construction
	client   kubernetes.Interface // set at construction: the Admin's, for the Service stand-in
	dir      string               // set at construction: Cloudly's token, the replication key
	cfg      daemon.Config        // set at construction: every relay's (its listeners on port 0)
	key      []byte               // set at construction: the replicas' shared replication key
	log      zerolog.Logger       // set at construction
	handover atomic.Int64         // handovers completed
	mark     atomic.Int64         // the fleet's answered requests when the newest handover completed

	mu       sync.Mutex
	pods     map[string]*devReplica // guarded by mu: the running relay of each Pod, by Pod name
	starting map[string]bool        // guarded by mu: Pods whose relay is being started
	closing  bool                   // guarded by mu: close has begun; nothing starts any more
	undo     []func()               // guarded by mu: what close undoes, newest last
}

// errReplicaRunning: a Pod's relay runs already, or is being started (its term ended, and it was
// started again as a kubelet would).
var errReplicaRunning = errors.New("its relay runs already")

// devReplica is one relay of the dev cluster, serving until stop.
type devReplica struct {
	name  string
	relay *relay.Relay
	hub   *vpnhub.Hub // bound on loopback, with the key every replica shares
	el    *ha.Elector
	stop  context.CancelFunc
	done  chan error // Serve's result
}

func startDevCluster(replicas int, log zerolog.Logger, logLevel string) (_ *devCluster, err error) {
	c := &devCluster{pods: map[string]*devReplica{}, starting: map[string]bool{}, log: log}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	if c.kube, err = kubeapi.StartProcess(); err != nil {
		return nil, err
	}
	c.undo = append(c.undo, func() {
		if err := c.kube.Stop(); err != nil {
			log.Warn().Err(err).Msg("stop the test API server")
		}
	})
	if err := c.kube.SetupNamespace(devHANamespace); err != nil {
		return nil, err
	}
	if c.client, err = c.kube.Client(kubeapi.Admin); err != nil {
		return nil, err
	}
	if c.cloudly, err = sim.NewCloudly(log); err != nil {
		return nil, err
	}
	c.undo = append(c.undo, c.cloudly.Close)
	if c.dir, err = os.MkdirTemp("", "relay-dev-ha-"); err != nil {
		return nil, err
	}
	c.undo = append(c.undo, func() { os.RemoveAll(c.dir) })
	tokenFile := filepath.Join(c.dir, "cloudly.jwt")
	if err := os.WriteFile(tokenFile, []byte(c.cloudly.Token+"\n"), 0o600); err != nil {
		return nil, err
	}
	keyFile := filepath.Join(c.dir, "replication.key")
	if err := daemon.WriteReplicationKey(keyFile); err != nil {
		return nil, err
	}
	key, err := vpnkey.ReadSecretFile(keyFile, log)
	if err != nil {
		return nil, err
	}
	c.key = key[:]
	c.cfg = daemon.Config{Config: relay.Config{
		ClusterID: c.cloudly.ClusterID, NodeID: "relay-node", CloudlyURL: c.cloudly.URL(), CloudlyTokenFile: tokenFile,
		Listen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: "127.0.0.1:0", BuildVersion: relay.DefaultBuildVersion,
		// Every replica binds a hub of its own on loopback with the one key (the chart's Secret);
		// the Service's UDP port reaches the leader's.
		HubListen: "127.0.0.1:0",
	}, LogLevel: logLevel, LogFormat: "console", HubKeyFile: filepath.Join(c.dir, "hub.key")}
	if err := c.cfg.Complete(); err != nil {
		return nil, err
	}
	if c.svc, err = kubeapi.StartService(c.client, devHANamespace, ha.RoleLabel, ha.RoleLeader,
		func(p *corev1.Pod) (string, bool) { return c.downstream(p.Name) },
		kubeapi.WithUDP(func(p *corev1.Pod) (netip.AddrPort, bool) { return c.hubAddr(p.Name) })); err != nil {
		return nil, err
	}
	c.undo = append(c.undo, c.svc.Close)
	for i := range replicas {
		name := fmt.Sprintf("relay-%d", i)
		// The Pods' IP is loopback: standbys dial the leader's replication listener there.
		if _, err := c.kube.CreatePod(devHANamespace, name, "127.0.0.1"); err != nil {
			return nil, err
		}
		if err := c.startReplica(name); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// close stops every relay, then what they ran against.
func (c *devCluster) close() {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	for _, r := range c.replicas() {
		c.stopReplica(r)
	}
	c.mu.Lock()
	undo := c.undo
	c.undo = nil
	c.mu.Unlock()
	for i := len(undo) - 1; i >= 0; i-- {
		undo[i]()
	}
}

// replicas is the running relays, by Pod name.
func (c *devCluster) replicas() []*devReplica {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*devReplica, 0, len(c.pods))
	for _, r := range c.pods {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// downstream is where the Service stand-in reaches Pod name's relay: the port its container
// listens on.
func (c *devCluster) downstream(name string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.pods[name]
	if !ok {
		return "", false
	}
	return r.relay.DownstreamAddr().String(), true
}

// hubAddr is where the Service stand-in's UDP port reaches Pod name's VPN hub.
func (c *devCluster) hubAddr(name string) (netip.AddrPort, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.pods[name]
	if !ok {
		return netip.AddrPort{}, false
	}
	return r.hub.Addr(), true
}

// startReplica starts the relay of Pod name as `relay run --ha-lease-name` would, with the Pod's
// name where the downward API puts POD_NAME; it stands by until elected. When its term ends the
// relay ends, and is started again, as its container would be.
func (c *devCluster) startReplica(name string) error {
	c.mu.Lock()
	if c.pods[name] != nil || c.starting[name] || c.closing {
		c.mu.Unlock()
		return errReplicaRunning
	}
	c.starting[name] = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.starting, name)
		c.mu.Unlock()
	}()
	log := c.log.With().Str("pod", name).Logger()
	var el *ha.Elector
	elect := func(log zerolog.Logger, reg prometheus.Registerer, parts []ha.Part) (relay.Elector, error) {
		client, err := c.kube.Client(kubeapi.Relay) // as the relay's service account
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		el, err = ha.New(ha.Config{LeaseName: devHALease, Namespace: devHANamespace, Identity: name, PodName: name, PodIP: "127.0.0.1",
			Client: client, Replication: ln, ReplicationKey: c.key, Parts: parts, Logger: log, Registerer: reg})
		if err != nil {
			ln.Close()
			return nil, err
		}
		return el, nil
	}
	// The hub binds loopback; the report names the advertise address, which Cloudly accepts.
	r, hub, err := daemon.BuildParts(c.cfg, relay.Options{Logger: log}, netip.MustParseAddr(c.cfg.AdvertiseAddress), elect)
	if err != nil {
		return err
	}
	if err := r.Listen(); err != nil {
		return err
	}
	ctx, stop := context.WithCancel(context.Background())
	rep := &devReplica{name: name, relay: r, hub: hub, el: el, stop: stop, done: make(chan error, 1)}
	go func() {
		err := r.Serve(ctx)
		rep.done <- err
		if errors.Is(err, relay.ErrTermEnded) && ctx.Err() == nil {
			c.restartReplica(rep)
		}
	}()
	c.mu.Lock()
	closing := c.closing
	if !closing {
		c.pods[name] = rep
	}
	c.mu.Unlock()
	if closing {
		stop()
		<-rep.done
		return errReplicaRunning
	}
	return nil
}

// restartReplica starts Pod r.name's relay again after its term ended, as the kubelet restarts a
// container that exited, unless the script stopped it meanwhile.
func (c *devCluster) restartReplica(r *devReplica) {
	c.mu.Lock()
	current := c.pods[r.name] == r
	if current {
		delete(c.pods, r.name)
	}
	c.mu.Unlock()
	if !current {
		return
	}
	c.log.Info().Str("pod", r.name).Str("outcome", "restart").Msg("the term ended: the relay starts again, a standby, as its container would")
	if err := c.startReplica(r.name); err != nil && !errors.Is(err, errReplicaRunning) {
		c.log.Warn().Err(err).Str("pod", r.name).Msg("the relay does not start again")
	}
}

// stopReplica shuts r down as SIGTERM does: it stops admitting, closes Cloudly, releases the
// Lease, relabels its Pod standby, then closes the nodes' connections.
func (c *devCluster) stopReplica(r *devReplica) {
	r.stop()
	if err := <-r.done; err != nil && !errors.Is(err, relay.ErrTermEnded) {
		c.log.Warn().Err(err).Str("pod", r.name).Msg("relay stopped with an error")
	}
	c.mu.Lock()
	if c.pods[r.name] == r {
		delete(c.pods, r.name)
	}
	c.mu.Unlock()
}

// leader is the running relay that holds the Lease, by its own account; nil: none.
func (c *devCluster) leader() *devReplica {
	for _, r := range c.replicas() {
		if _, me := r.el.Holder(); me {
			return r
		}
	}
	return nil
}

// script hands the leadership over every devHAHandoverEvery until ctx ends.
func (c *devCluster) script(ctx context.Context, f *devFleet, say func(string, ...any)) {
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(devHAHandoverEvery):
		}
		old := c.leader()
		if old == nil {
			say("scripted handover %d: no relay leads now; trying again in %s", n, devHAHandoverEvery)
			continue
		}
		say("scripted handover %d: %s steps down as on SIGTERM (Cloudly closed, Lease released, Pod relabelled standby, nodes closed)", n, old.name)
		began := time.Now()
		c.stopReplica(old)
		next, err := c.waitNewLeader(ctx, old.name)
		if err != nil {
			say("scripted handover %d: %v", n, err)
		} else {
			c.mark.Store(f.requests.Load())
			c.handover.Add(1)
			say("scripted handover %d: %s leads %.1f s after %s began stepping down; the nodes register again through the Service",
				n, next, time.Since(began).Seconds(), old.name)
		}
		if ctx.Err() != nil {
			return
		}
		if err := c.startReplica(old.name); errors.Is(err, errReplicaRunning) {
			say("scripted handover %d: %s runs again already: its term ended and it restarted, a standby", n, old.name)
			continue
		} else if err != nil {
			say("scripted handover %d: %s does not start again: %v", n, old.name, err)
			continue
		}
		say("scripted handover %d: %s started again, a standby", n, old.name)
	}
}

// waitNewLeader waits, up to a lease duration and 10 s more, until the Service stand-in routes to
// a relay other than old and Cloudly holds its socket.
func (c *devCluster) waitNewLeader(ctx context.Context, old string) (string, error) {
	deadline := time.After(ha.DefaultLeaseDuration + 10*time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if names := c.svc.Selected(); len(names) == 1 && names[0] != old && c.cloudly.Attached() {
			return names[0], nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("the run ended before another relay led")
		case <-deadline:
			return "", fmt.Errorf("no other relay led within %s", ha.DefaultLeaseDuration+10*time.Second)
		case <-tick.C:
		}
	}
}

// summary is the dev cluster's one line: what the nodes observed, and the handovers.
func (c *devCluster) summary(f *devFleet) string {
	handovers, mark := c.handover.Load(), c.mark.Load() // the count first: the mark is stored before it
	requests := f.requests.Load()
	since := int64(0)
	if handovers > 0 {
		since = requests - mark
	}
	return fmt.Sprintf("nodes=%d registrations=%d requests=%d requestsSinceHandover=%d refused=%d handovers=%d twoAttached=%d",
		f.registered(), f.registrations.Load(), requests, since, f.refused.Load(), handovers, c.cloudly.TwoAttached())
}

// leaderNames is the Pods the Service routes to, for the live line: "none", one name, or
// several joined by commas.
func leaderNames(svc *kubeapi.Service) string {
	if l := svc.Selected(); len(l) > 0 {
		return strings.Join(l, ",")
	}
	return "none"
}

// devFleet is the simulated nodes of `relay-dev --replicas`, each driven as a Pallet node
// behaves across a failover: it keeps one connection through the Service (dialling again 100 ms
// after one ends or fails), registers on every new connection, and reports to Cloudly every
// 200 ms.
type devFleet struct {
	nodes         []*sim.Node
	ok            []atomic.Bool // per node: registered at least once
	registrations atomic.Int64  // accepted registrations, every node
	requests      atomic.Int64  // reports answered end to end
	refused       atomic.Int64  // dials, registrations and reports that failed
	stop          chan struct{}
	stopOnce      sync.Once
	wg            sync.WaitGroup
}

func startDevFleet(url string, n int, log zerolog.Logger) *devFleet {
	f := &devFleet{stop: make(chan struct{}), ok: make([]atomic.Bool, n)}
	for i := range n {
		node := sim.NewNode(fmt.Sprintf("node-%03d", i), log)
		f.nodes = append(f.nodes, node)
		f.wg.Add(1)
		go func() { defer f.wg.Done(); f.drive(i, node, url) }()
	}
	return f
}

// close stops every node and closes its connection; later calls do nothing.
func (f *devFleet) close() {
	f.stopOnce.Do(func() {
		close(f.stop)
		f.wg.Wait()
		for _, n := range f.nodes {
			n.Close()
		}
	})
}

// registered is how many nodes registered at least once.
func (f *devFleet) registered() int64 {
	var n int64
	for i := range f.ok {
		if f.ok[i].Load() {
			n++
		}
	}
	return n
}

func (f *devFleet) drive(i int, n *sim.Node, url string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-f.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	wait := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	for seq := 1; ctx.Err() == nil; seq++ {
		if c := n.Conn(); c == nil || c.Context().Err() != nil {
			if err := f.connect(ctx, n, url); err != nil {
				f.refused.Add(1)
				wait(100 * time.Millisecond)
				continue
			}
			f.ok[i].Store(true)
			f.registrations.Add(1)
		}
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := n.Report(rctx, "reportRuntimeAssignmentObservation", map[string]any{"sequence": seq})
		rcancel()
		if err == nil {
			f.requests.Add(1)
		} else if ctx.Err() == nil {
			f.refused.Add(1)
		}
		wait(200 * time.Millisecond)
	}
}

// connect dials the Service and registers, as a node does on every new connection.
func (f *devFleet) connect(ctx context.Context, n *sim.Node, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n.Close()
	if err := n.Connect(ctx, url); err != nil {
		return err
	}
	if _, err := n.Register(ctx); err != nil {
		n.Close()
		return err
	}
	return nil
}
