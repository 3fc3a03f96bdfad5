package ha

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// Pod label and annotations: the role every relay gives its own Pod, which the chart's
// Service selects on; where its replication listener is; and the cost Kubernetes weighs when it
// picks a Pod of a ReplicaSet to delete (the lowest goes first), high on the leader and low on a
// standby, so that a rolling upgrade or a scale-down removes the standbys first and hands over
// once.
const (
	RoleLabel              = "relay.serve.zone/role"
	RoleLeader             = "leader"
	RoleStandby            = "standby"
	ReplicationAnnotation  = "relay.serve.zone/replication"
	DeletionCostAnnotation = "controller.kubernetes.io/pod-deletion-cost"
	LeaderDeletionCost     = "1000"
	StandbyDeletionCost    = "0"
)

// Defaults of docs/ha.md; zero Config fields mean them.
const (
	DefaultLeaseDuration = 6 * time.Second
	DefaultRenewDeadline = 4 * time.Second
	DefaultRetryPeriod   = 500 * time.Millisecond
	// apiTimeout bounds one call to the API server, so that no call outlives a renewal.
	apiTimeout = 2 * time.Second
)

// quietKlog silences klog once per process: setting it races with electors already running.
var quietKlog sync.Once

// Config is what an Elector is told.
type Config struct {
	LeaseName, Namespace string // the Lease (coordination.k8s.io/v1) the relays compete for
	Identity             string // this relay in the Lease: the Pod's name
	PodName              string // the Pod this relay labels and annotates; empty: none (tests)
	PodIP                string // the address standbys dial for replication
	LeaseDuration        time.Duration
	RenewDeadline        time.Duration
	RetryPeriod          time.Duration
	Client               kubernetes.Interface // the API, as the relay's service account

	// Replication (replica.go): the listener standbys dial, the replicas' shared key, and the
	// parts copied, each under its own key prefix; none copies nothing.
	Replication    net.Listener
	ReplicationKey []byte
	Parts          []Part
	MaxCopyBytes   int64         // a standby's copy at most; zero: DefaultMaxCopyBytes
	AckTimeout     time.Duration // how long a hold waits for the standbys (Sync); zero: DefaultAckTimeout

	Logger     zerolog.Logger
	Registerer prometheus.Registerer
	// Now is the clock the tenure is measured on; nil is time.Now, whose readings carry the
	// monotonic clock.
	Now func() time.Time
}

// Elector is the relay's side of the election: client-go's leaderelection on a LeaseLock, the
// Pod's role label, and escrow's replication. It implements relay.Elector and feature.Tenure. An
// Elector runs one term: once the relay it elected has fenced, its Run returns, and the relay's
// process exits, to start again as a standby.
type Elector struct {
	cfg    Config         // set at construction
	log    zerolog.Logger // set at construction
	m      *metrics       // set at construction
	rep    *replication   // set at construction
	tenure *tenure        // set at construction

	lastAPI atomic.Int64 // the last call the API server answered: 1 + its reading of apiClock, 0 for none

	labelMu  sync.Mutex // serialises the Pod's role label writes, so the newest role lands last
	labelled string     // guarded by labelMu: the role the Pod was last labelled with ("": none yet)

	mu     sync.Mutex
	role   string    // guarded by mu
	holder string    // guarded by mu: who holds the Lease, as last seen
	since  time.Time // guarded by mu: when role last changed
}

// New checks the configuration and builds the Elector; nothing runs until Run.
func New(cfg Config) (*Elector, error) {
	if cfg.LeaseName == "" || cfg.Namespace == "" || cfg.Identity == "" || cfg.Client == nil {
		return nil, errors.New("ha: a lease name, a namespace, an identity and an API client are required")
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.RenewDeadline <= 0 {
		cfg.RenewDeadline = DefaultRenewDeadline
	}
	if cfg.RetryPeriod <= 0 {
		cfg.RetryPeriod = DefaultRetryPeriod
	}
	if cfg.RenewDeadline >= cfg.LeaseDuration {
		return nil, errors.New("ha: the renew deadline must be shorter than the lease duration")
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	// client-go's leader election logs through klog, a process-wide logger; the relay logs the
	// transitions itself.
	quietKlog.Do(func() { klog.SetLogger(logr.Discard()) })
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	e := &Elector{cfg: cfg, log: cfg.Logger.With().Str("component", "ha").Logger(), m: m, role: RoleStandby, since: cfg.Now(),
		tenure: newTenure(cfg.Now, cfg.RenewDeadline)}
	if e.rep, err = e.newReplication(); err != nil {
		return nil, err
	}
	return e, nil
}

// Run competes for the Lease until ctx ends, for one term. It labels the Pod a standby
// first; elected, it relabels the previous holder's Pod a standby, labels its own the leader and
// runs lead, whose context ends when the tenure does or client-go stops renewing, and which
// returns once the relay has fenced itself. Fencing ends the term: client-go's run is cancelled,
// so that it renews nothing more for a relay that no longer leads, and with ReleaseOnCancel it
// releases the Lease if the API answers (else the Lease expires). Run then labels the Pod a
// standby and returns nil: the relay's process exits, and comes back as a standby whose
// registrationSequence starts at 0, so that no process ever leads twice. It returns nil when ctx
// ends as well; the caller tells the two apart by ctx.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context)) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, stop := context.WithCancel(ctx)
	defer stop() // the term is over: the replication listener and the label loop end with Run
	e.annotate(ctx)
	wg.Add(3)
	go func() { defer wg.Done(); e.rep.serve(ctx) }()
	go func() { defer wg.Done(); e.rep.follow(ctx) }()
	go func() { defer wg.Done(); e.keepLabel(ctx) }()
	lock := &observedLock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: e.cfg.LeaseName, Namespace: e.cfg.Namespace},
		Client:     e.cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.cfg.Identity},
	}, e: e}
	started := make(chan context.Context, 1)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: e.cfg.LeaseDuration, RenewDeadline: e.cfg.RenewDeadline, RetryPeriod: e.cfg.RetryPeriod,
		ReleaseOnCancel: true, Name: e.cfg.LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) { started <- lctx },
			OnStoppedLeading: func() {},
			OnNewLeader:      e.newHolder,
		},
	})
	if err != nil {
		return err
	}
	termCtx, endTerm := context.WithCancel(ctx)
	defer endTerm()
	done := make(chan struct{})
	go func() { le.Run(termCtx); close(done) }()
	select {
	case lctx := <-started:
		e.leadWhile(lctx, lock, lead)
	case <-done:
		select {
		case lctx := <-started: // elected, and lost it, before this looked
			e.leadWhile(lctx, lock, lead)
		default:
		}
	}
	endTerm()
	<-done
	e.setRole(RoleStandby)
	return nil
}

// leadWhile runs lead while the relay holds the Lease, within its tenure. lead's context ends
// when client-go's does, or the moment the tenure runs out — client-go gives up renewing at its
// own pace, and may spend another renew deadline releasing the Lease, past its expiry for the
// others.
func (e *Elector) leadWhile(lctx context.Context, lock *observedLock, lead func(ctx context.Context)) {
	e.tenure.begin()
	defer e.tenure.end()
	if lctx.Err() != nil || !e.tenure.held() {
		return // lost already, or acquired by a write answered past its tenure: never lead on it
	}
	ctx, fence := context.WithCancel(lctx)
	defer fence()
	context.AfterFunc(ctx, e.tenure.end) // the tenure ends the instant the term's context does
	go e.tenure.watch(ctx, func() {
		e.log.Warn().Str("outcome", "fenced").Msg("the tenure ran out: the Lease was not renewed within the renew deadline of its last renewal's sending")
		fence()
	})
	e.relabelPrevious(ctx, lock.previousHolder())
	e.setRole(RoleLeader)
	e.log.Info().Str("outcome", RoleLeader).Msg("elected: this relay leads")
	lead(ctx)
}

// Held implements feature.Tenure: the relay leads, within its tenure, at this instant.
func (e *Elector) Held() bool { return e.tenure.held() }

// relabelPrevious labels the Pod of the Lease's previous holder a standby, with a standby's
// deletion cost, before this relay attaches: a holder that hung (stopped, partitioned from the
// API) cannot relabel itself, and the Service would keep sending nodes to it. Each try is bounded
// by the API timeout; one that fails is logged, and tried again every retry period while the term
// runs, and the relay leads meanwhile.
func (e *Elector) relabelPrevious(ctx context.Context, holder string) {
	if holder == "" || holder == e.cfg.Identity || e.cfg.PodName == "" {
		return
	}
	patch := rolePatch(RoleStandby)
	if e.patchPod(holder, patch, "relabel the previous leader's Pod "+holder+" a standby") {
		return
	}
	go func() {
		t := time.NewTicker(e.cfg.RetryPeriod)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if !e.tenure.held() || e.patchPod(holder, patch, "relabel the previous leader's Pod "+holder+" a standby") {
					return
				}
			}
		}
	}()
}

// rolePatch is the merge patch giving a Pod a role: its label and its deletion cost.
func rolePatch(role string) []byte {
	cost := StandbyDeletionCost
	if role == RoleLeader {
		cost = LeaderDeletionCost
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels": map[string]string{RoleLabel: role}, "annotations": map[string]string{DeletionCostAnnotation: cost}}})
	return patch
}

// setRole records the relay's role, and labels the Pod with it.
func (e *Elector) setRole(role string) {
	e.mu.Lock()
	changed := e.role != role
	if changed {
		e.role, e.since = role, e.cfg.Now()
	}
	e.mu.Unlock()
	e.m.leader.Set(map[bool]float64{true: 1}[role == RoleLeader])
	if changed {
		e.m.transitions.WithLabelValues(role).Inc()
	}
	e.label()
}

// newHolder records who holds the Lease now.
func (e *Elector) newHolder(identity string) {
	e.mu.Lock()
	e.holder = identity
	e.mu.Unlock()
	e.rep.holderChanged()
}

// Holder is who holds the Lease, as last seen ("" when unknown), and whether it is this relay.
func (e *Elector) Holder() (string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.holder, e.holder == e.cfg.Identity && e.role == RoleLeader
}

// label sets the Pod's role label to the relay's current role (docs/ha.md), bounded by apiTimeout;
// a failure is logged, and keepLabel tries again.
func (e *Elector) label() {
	if e.cfg.PodName == "" {
		return
	}
	e.labelMu.Lock()
	defer e.labelMu.Unlock()
	e.mu.Lock()
	role := e.role
	e.mu.Unlock()
	if role == e.labelled {
		return
	}
	if e.patchPod(e.cfg.PodName, rolePatch(role), "label the Pod "+role) {
		e.labelled = role
	}
}

// keepLabel labels the Pod again, every retry period, while its label is not the relay's role: a
// leader fenced while the API server was away could not relabel itself standby, and the Service
// would keep sending nodes to it once another relay leads.
func (e *Elector) keepLabel(ctx context.Context) {
	if e.cfg.PodName == "" {
		return
	}
	t := time.NewTicker(e.cfg.RetryPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			e.label()
		}
	}
}

// annotate labels the Pod a standby and names its replication address, before the relay
// competes.
func (e *Elector) annotate(ctx context.Context) {
	if e.cfg.PodName == "" {
		return
	}
	annotations := map[string]string{DeletionCostAnnotation: StandbyDeletionCost}
	if e.cfg.Replication != nil && e.cfg.PodIP != "" {
		_, port, _ := net.SplitHostPort(e.cfg.Replication.Addr().String())
		annotations[ReplicationAnnotation] = net.JoinHostPort(e.cfg.PodIP, port)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{RoleLabel: RoleStandby}, "annotations": annotations}})
	for ctx.Err() == nil && !e.patchPod(e.cfg.PodName, patch, "label the Pod a standby") {
		select {
		case <-ctx.Done():
		case <-time.After(e.cfg.RetryPeriod):
		}
	}
	if ctx.Err() == nil {
		e.labelMu.Lock()
		e.labelled = RoleStandby
		e.labelMu.Unlock()
	}
}

// patchPod merges patch into Pod name, bounded by apiTimeout; a failure is logged.
func (e *Elector) patchPod(name string, patch []byte, what string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	_, err := e.cfg.Client.CoreV1().Pods(e.cfg.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		e.log.Warn().Err(err).Str("outcome", "failed").Msg("cannot " + what)
		return false
	}
	e.answered()
	return true
}

// apiClock reads the tenure's monotonic clock (an offset from its base, immune to the wall
// clock's steps), on which the API server's silence is judged.
func (e *Elector) apiClock() int64 { return int64(e.tenure.offset()) }

// answered notes that the API server answered a call now.
func (e *Elector) answered() { e.lastAPI.Store(1 + e.apiClock()) }

// Ready says why the relay could not lead now: the API server has answered nothing for a lease
// duration, or its copy of the leader's replicated state is not complete (the replication side judges that).
func (e *Elector) Ready() error {
	last := e.lastAPI.Load()
	if last == 0 || time.Duration(e.apiClock()-(last-1)) > e.cfg.LeaseDuration {
		return fmt.Errorf("the Kubernetes API has answered nothing for %s", e.cfg.LeaseDuration)
	}
	return e.rep.copyReady()
}

// Status is the status page's ha section.
type Status struct {
	Role        string            `json:"role"`
	Holder      string            `json:"holder"`
	Since       time.Time         `json:"since"`
	Replication ReplicationStatus `json:"replication"`
}

// Status implements relay.Elector.
func (e *Elector) Status() any {
	e.mu.Lock()
	st := Status{Role: e.role, Holder: e.holder, Since: e.since}
	e.mu.Unlock()
	st.Replication = e.rep.status()
	return st
}

// observedLock is the LeaseLock, noting when the API server last answered, the tenure each of
// this relay's writes buys, and the Lease's last holder other than this relay. client-go calls it
// from its one election goroutine.
type observedLock struct {
	resourcelock.Interface
	e *Elector // set at construction

	mu       sync.Mutex
	lastSeen string // guarded by mu: the holder the last read of the Lease named
	previous string // guarded by mu: the last holder other than this relay any read named
}

func (l *observedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	r, b, err := l.Interface.Get(ctx)
	if err == nil || apierrors.IsNotFound(err) {
		l.e.answered()
	}
	if err == nil {
		l.mu.Lock()
		l.lastSeen = r.HolderIdentity
		if r.HolderIdentity != "" && r.HolderIdentity != l.e.cfg.Identity {
			l.previous = r.HolderIdentity
		}
		l.mu.Unlock()
	}
	return r, b, err
}

// previousHolder is the last holder other than this relay the Lease named.
func (l *observedLock) previousHolder() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.previous
}

func (l *observedLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	sent := l.e.tenure.sending()
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	err := l.Interface.Create(ctx, ler)
	l.answered(err, ler, sent)
	return err
}

// errNotOurs refuses client-go's release of a Lease another relay holds: client-go releases on
// the record it remembers, not on the one it has just read, and would clear a successor's Lease
// when a stopped relay resumes and ends its term.
var errNotOurs = errors.New("ha: the Lease is held by another relay: not released")

func (l *observedLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if ler.HolderIdentity == "" {
		l.mu.Lock()
		ours := l.lastSeen == l.e.cfg.Identity
		l.mu.Unlock()
		if !ours {
			return errNotOurs
		}
	}
	sent := l.e.tenure.sending()
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	err := l.Interface.Update(ctx, ler)
	l.answered(err, ler, sent)
	return err
}

// answered notes a write's answer: the API is reachable, and a write naming this relay as holder,
// sent at sent, extends its tenure from that instant.
func (l *observedLock) answered(err error, ler resourcelock.LeaderElectionRecord, sent time.Duration) {
	if err != nil {
		return
	}
	l.e.answered()
	l.mu.Lock()
	l.lastSeen = ler.HolderIdentity
	l.mu.Unlock()
	if ler.HolderIdentity == l.e.cfg.Identity {
		l.e.tenure.renewed(sent)
	}
}
