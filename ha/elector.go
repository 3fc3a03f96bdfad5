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

// Pod label and annotation (SPEC §16): the role every relay gives its own Pod, which the chart's
// Service selects on, and where its replication listener is.
const (
	RoleLabel             = "relay.serve.zone/role"
	RoleLeader            = "leader"
	RoleStandby           = "standby"
	ReplicationAnnotation = "relay.serve.zone/replication"
)

// Defaults of SPEC §16; zero Config fields mean them.
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
}

// Elector is the relay's side of the election: client-go's leaderelection on a LeaseLock, the
// Pod's role label, and escrow's replication. It implements relay.Elector.
type Elector struct {
	cfg Config         // set at construction
	log zerolog.Logger // set at construction
	m   *metrics       // set at construction
	rep *replication   // set at construction

	lastAPI   atomic.Int64 // unix nanos of the last call the API server answered
	lastRenew atomic.Int64 // unix nanos of the last successful Lease update while leading

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
	e := &Elector{cfg: cfg, log: cfg.Logger.With().Str("component", "ha").Logger(), m: m, role: RoleStandby, since: time.Now()}
	if e.rep, err = e.newReplication(); err != nil {
		return nil, err
	}
	return e, nil
}

// Run competes for the Lease until ctx ends (SPEC §16). It labels the Pod a standby first; while
// elected it labels it the leader and runs lead, which returns once the relay has fenced itself;
// a relay that loses the Lease competes again as a standby. On return the Lease is released and
// the Pod a standby.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context)) error {
	e.annotate(ctx)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); e.rep.serve(ctx) }()
	go func() { defer wg.Done(); e.rep.follow(ctx) }()
	go func() { defer wg.Done(); e.keepLabel(ctx) }()
	defer wg.Wait()
	lock := &observedLock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: e.cfg.LeaseName, Namespace: e.cfg.Namespace},
		Client:     e.cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.cfg.Identity},
	}, e: e}
	for ctx.Err() == nil {
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
		done := make(chan struct{})
		go func() { le.Run(ctx); close(done) }()
		select {
		case lctx := <-started:
			e.leadWhile(lctx, lead)
			<-done
		case <-done:
			select {
			case lctx := <-started: // elected, and lost it, before this loop looked
				e.leadWhile(lctx, lead)
			default:
			}
		}
		e.setRole(RoleStandby)
	}
	return nil
}

// leadWhile runs lead while the relay holds the Lease. Its context ends when client-go's does, or
// when the last renewal is older than the renew deadline: client-go gives up renewing there too,
// but may spend another renew deadline releasing the Lease first, past its expiry for the others.
func (e *Elector) leadWhile(lctx context.Context, lead func(ctx context.Context)) {
	if lctx.Err() != nil {
		return // lost already: never lead on a Lease given up
	}
	ctx, fence := context.WithCancel(lctx)
	defer fence()
	e.lastRenew.Store(time.Now().UnixNano())
	go func() {
		t := time.NewTicker(e.cfg.RetryPeriod / 2)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				if now.Sub(time.Unix(0, e.lastRenew.Load())) >= e.cfg.RenewDeadline {
					e.log.Warn().Str("outcome", "fenced").Msg("the Lease was not renewed within the renew deadline: standing by")
					fence()
					return
				}
			}
		}
	}()
	e.setRole(RoleLeader)
	e.log.Info().Str("outcome", RoleLeader).Msg("elected: this relay leads")
	lead(ctx)
	e.setRole(RoleStandby)
}

// setRole records the relay's role, and labels the Pod with it.
func (e *Elector) setRole(role string) {
	e.mu.Lock()
	changed := e.role != role
	if changed {
		e.role, e.since = role, time.Now()
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

// label sets the Pod's role label to the relay's current role (SPEC §16), bounded by apiTimeout;
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
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{RoleLabel: role}}})
	if e.patchPod(patch, "label the Pod "+role) {
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
	meta := map[string]any{"labels": map[string]string{RoleLabel: RoleStandby}}
	if e.cfg.Replication != nil && e.cfg.PodIP != "" {
		_, port, _ := net.SplitHostPort(e.cfg.Replication.Addr().String())
		meta["annotations"] = map[string]string{ReplicationAnnotation: net.JoinHostPort(e.cfg.PodIP, port)}
	}
	patch, _ := json.Marshal(map[string]any{"metadata": meta})
	for ctx.Err() == nil && !e.patchPod(patch, "label the Pod a standby") {
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

func (e *Elector) patchPod(patch []byte, what string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	_, err := e.cfg.Client.CoreV1().Pods(e.cfg.Namespace).Patch(ctx, e.cfg.PodName, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		e.log.Warn().Err(err).Str("outcome", "failed").Msg("cannot " + what)
		return false
	}
	e.lastAPI.Store(time.Now().UnixNano())
	return true
}

// Ready says why the relay could not lead now: the API server has answered nothing for a lease
// duration.
func (e *Elector) Ready() error {
	last := e.lastAPI.Load()
	if last == 0 || time.Since(time.Unix(0, last)) > e.cfg.LeaseDuration {
		return fmt.Errorf("the Kubernetes API has answered nothing for %s", e.cfg.LeaseDuration)
	}
	return nil
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

// observedLock is the LeaseLock, noting when the API server last answered and when the Lease was
// last renewed.
type observedLock struct {
	resourcelock.Interface
	e *Elector
}

func (l *observedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	r, b, err := l.Interface.Get(ctx)
	if err == nil || apierrors.IsNotFound(err) {
		l.e.lastAPI.Store(time.Now().UnixNano())
	}
	return r, b, err
}

func (l *observedLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	err := l.Interface.Create(ctx, ler)
	l.answered(err, ler)
	return err
}

func (l *observedLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	err := l.Interface.Update(ctx, ler)
	l.answered(err, ler)
	return err
}

func (l *observedLock) answered(err error, ler resourcelock.LeaderElectionRecord) {
	if err != nil {
		return
	}
	now := time.Now().UnixNano()
	l.e.lastAPI.Store(now)
	if ler.HolderIdentity == l.e.cfg.Identity {
		l.e.lastRenew.Store(now)
	}
}
