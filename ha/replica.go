package ha

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"code.foss.global/serve.zone/relay/feature"
)

// Escrow survives a failover (docs/ha.md): the leader copies its replicated parts' records to every
// standby that dials it — the whole state first, then every change — and a standby adopts them
// as its own state, so that it holds every run, re-binding pair and acknowledgement (and the VPN
// membership) when it leads. In memory only, bounded on both sides, never logged. Every relay
// listens; only the leader feeds (feed.go); a standby dials the address on the Pod the Lease names
// as holder (follow.go). A hold is answered once every standby with a complete copy has
// acknowledged it (Sync).

// Bounds and timings of replication.
const (
	// DefaultMaxCopyBytes bounds a standby's copy; past it the copy is incomplete, and says so.
	DefaultMaxCopyBytes = 512 << 20
	// DefaultAckTimeout bounds how long a hold waits for the standbys' acknowledgements
	// (--ha-replication-ack); a standby that misses it is closed.
	DefaultAckTimeout = time.Second
	// maxChannels bounds the replication connections open at once, authenticated or not: eight
	// of the relay's 256-descriptor reserve.
	maxChannels = 8
	// keepalive is how often each side sends when it has nothing else to say; a peer heard from
	// not at all for silence is dropped.
	keepalive = 2 * time.Second
	silence   = 10 * time.Second
	// standbyShare caps one standby's send queue on the leader, charged to the relay's memory
	// budget (or, without one, counted against this cap alone); recordCost is charged per record
	// beyond its key and value.
	standbyShare = 64 << 20
	recordCost   = 64
	dialTimeout  = 5 * time.Second
)

// Part is one replicated part and the key prefix that every one of its records begins with: a
// standby's copy routes each record to the part whose prefix it has. No prefix may be another's
// prefix.
type Part struct {
	Prefix string
	Part   feature.Replicated
	// Runs, when set, is the prefix of the records that are escrowed runs: what
	// relay_ha_replicated_runs and the status page count.
	Runs string
}

// ReplicationStatus is the status page's replication section.
type ReplicationStatus struct {
	Connected int  `json:"connected"` // on the leader: standbys fed; on a standby: 1 while it follows
	Runs      int  `json:"runs"`      // on the leader: runs it replicates; on a standby: runs it holds as a copy
	Complete  bool `json:"complete"`  // a standby's copy is whole and current (the leader's own state: true)
	// On the leader: each standby fed, and whether it has acknowledged the whole state (only
	// those are waited for by a hold).
	Standbys []StandbyStatus `json:"standbys,omitempty"`
	// On the leader: the last hold answered before every standby had it, and the last standby
	// dropped; the counts are relay_ha_holds_unreplicated_total and
	// relay_ha_standbys_dropped_total.
	LastUnreplicated *EventStatus `json:"lastUnreplicated,omitempty"`
	LastDropped      *EventStatus `json:"lastDropped,omitempty"`
}

// StandbyStatus is one standby the leader feeds.
type StandbyStatus struct {
	Pod      string    `json:"pod"`
	Since    time.Time `json:"since"`
	Complete bool      `json:"complete"`
}

// EventStatus is when something happened, why, and to which standby (none for a hold that had no
// standby to wait for).
type EventStatus struct {
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
	Pod    string    `json:"pod,omitempty"`
}

// replicationConfig is what the replication is told, set at construction.
type replicationConfig struct {
	listener     net.Listener // standbys dial it; nil: this relay feeds no one
	key          []byte       // the replicas' shared key
	parts        []Part
	self         []string // this relay's names (Pod, identity): a hello naming one is refused
	pod          string   // the Pod this relay's hello names
	maxCopy      int64
	ackTimeout   time.Duration
	writeTimeout time.Duration
	clock        clock.WithTickerAndDelayedExecution
}

// replicationPorts are the election's answers the replication needs, set at construction.
type replicationPorts struct {
	leading func() bool   // this relay leads now
	holder  func() string // who holds the Lease, as last seen ("": unknown)
	// address is the holder's replication address (its Pod's annotation).
	address func(ctx context.Context, holder string) (string, error)
	// checkPod says why pod may not copy from this relay (nil: it may): the Pod must exist and be
	// of this relay's release. nil: the name alone is judged.
	checkPod func(ctx context.Context, pod string) error
}

// replication is both sides of the channel.
type replication struct {
	cfg replicationConfig // set at construction
	p   replicationPorts  // set at construction
	log zerolog.Logger    // set at construction
	m   *metrics          // set at construction
	// refusalLog is log sampled: anyone on the cluster network can have a connection refused.
	refusalLog zerolog.Logger // set at construction

	memory atomic.Value // feature.Memory, set by useMemory before Run: standbys' queues are charged to it

	runMu       sync.Mutex
	runsFedKeys map[string]bool // guarded by runMu: the runs the leader has replicated

	mu               sync.Mutex
	slots            map[*slot]struct{} // guarded by mu: replication connections open (leader side)
	byPod            map[string]*feed   // guarded by mu: standbys fed while leading, one per Pod
	lastUnreplicated *EventStatus       // guarded by mu
	lastDropped      *EventStatus       // guarded by mu
	following        net.Conn           // guarded by mu: the connection to the leader a standby follows
	copyKeys         map[string]int     // guarded by mu: a standby's copied records and their sizes
	copyBytes        int64              // guarded by mu
	copiedRuns       int                // guarded by mu: the copied records that are runs
	copyComplete     bool               // guarded by mu: the copy is whole as of the leader's synced marker
	overflow         bool               // guarded by mu: a record did not fit maxCopy
	copiedFrom       string             // guarded by mu: the leader the copy came from ("": none, or this relay led since)
	heard            atomic.Int64       // clock's Unix nanos of the last frame from the leader followed
	wake             chan struct{}      // the holder changed: follow looks again
}

func newReplication(cfg replicationConfig, p replicationPorts, log zerolog.Logger, m *metrics) (*replication, error) {
	for i, a := range cfg.parts {
		if a.Prefix == "" || a.Part == nil {
			return nil, errors.New("ha: every replicated part needs a key prefix")
		}
		for _, b := range cfg.parts[i+1:] {
			if strings.HasPrefix(a.Prefix, b.Prefix) || strings.HasPrefix(b.Prefix, a.Prefix) {
				return nil, fmt.Errorf("ha: replicated parts' prefixes %q and %q overlap", a.Prefix, b.Prefix)
			}
		}
	}
	if cfg.maxCopy <= 0 {
		cfg.maxCopy = DefaultMaxCopyBytes
	}
	if cfg.ackTimeout <= 0 {
		cfg.ackTimeout = DefaultAckTimeout
	}
	if cfg.writeTimeout <= 0 {
		cfg.writeTimeout = writeTimeout
	}
	if cfg.clock == nil {
		cfg.clock = clock.RealClock{}
	}
	return &replication{cfg: cfg, p: p, log: log, m: m, refusalLog: log.Sample(&zerolog.BurstSampler{Burst: 5, Period: time.Second}), slots: make(map[*slot]struct{}), byPod: make(map[string]*feed),
		copyKeys: make(map[string]int), runsFedKeys: make(map[string]bool), wake: make(chan struct{}, 1)}, nil
}

// partOf is the part that owns key.
func (r *replication) partOf(key string) (Part, bool) {
	for _, p := range r.cfg.parts {
		if strings.HasPrefix(key, p.Prefix) {
			return p, true
		}
	}
	return Part{}, false
}

func (r *replication) isRun(key string) bool {
	p, ok := r.partOf(key)
	return ok && p.Runs != "" && strings.HasPrefix(key, p.Runs)
}

// useMemory charges every standby's send queue to m from now on.
func (r *replication) useMemory(m feature.Memory) {
	if m != nil {
		r.memory.Store(m)
	}
}

// countRun notes a run record the leader replicates; it runs under the replicated part's lock.
func (r *replication) countRun(key string, value []byte) {
	if !r.isRun(key) {
		return
	}
	r.runMu.Lock()
	if value == nil {
		delete(r.runsFedKeys, key)
	} else {
		r.runsFedKeys[key] = true
	}
	n := len(r.runsFedKeys)
	r.runMu.Unlock()
	r.m.replicatedRuns.Set(float64(n))
}

func (r *replication) runsFed() int {
	r.runMu.Lock()
	defer r.runMu.Unlock()
	return len(r.runsFedKeys)
}

// holderChanged: the Lease has another holder. A standby follows the new one; a relay that no
// longer leads feeds no one.
func (r *replication) holderChanged() {
	mine := r.isSelf(r.p.holder())
	r.mu.Lock()
	if r.following != nil {
		r.following.Close()
	}
	var feeds []*feed
	if !mine {
		for _, f := range r.byPod {
			feeds = append(feeds, f)
		}
	} else {
		r.copiedFrom = "" // what it holds from now on is its own state, not a copy of anyone's
	}
	r.mu.Unlock()
	for _, f := range feeds {
		f.end(errStepDown)
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// complete reports whether this relay holds the whole, current state: while it leads, its own;
// as a standby, only a copy it is still following, that reached the leader's synced marker, fits
// its bound, and was heard from within the silence bound. The standby's readiness rests on it.
func (r *replication) complete() bool {
	if r.p.leading() {
		return true
	}
	if len(r.cfg.parts) == 0 {
		return true // nothing to copy, nothing missing
	}
	r.mu.Lock()
	ok := r.copyComplete && !r.overflow && r.following != nil
	r.mu.Unlock()
	return ok && r.cfg.clock.Since(time.Unix(0, r.heard.Load())) <= silence
}

func (r *replication) status() ReplicationStatus {
	if r.p.leading() {
		r.mu.Lock()
		defer r.mu.Unlock()
		st := ReplicationStatus{Connected: len(r.byPod), Runs: r.runsFed(), Complete: true,
			LastUnreplicated: r.lastUnreplicated, LastDropped: r.lastDropped}
		for _, f := range r.byPod {
			st.Standbys = append(st.Standbys, StandbyStatus{Pod: f.pod, Since: f.since, Complete: f.isReady()})
		}
		slices.SortFunc(st.Standbys, func(a, b StandbyStatus) int { return strings.Compare(a.Pod, b.Pod) })
		return st
	}
	complete := r.complete()
	r.mu.Lock()
	defer r.mu.Unlock()
	st := ReplicationStatus{Runs: r.copiedRunsLocked(), Complete: complete}
	if r.following != nil {
		st.Connected = 1
	}
	return st
}

// copyReady says why this relay's copy of the leader's replicated state is not complete, for the
// Elector's Ready (a standby's /readyz): nil on the leader, with nothing to copy, or once the
// standby holds the leader's whole state and follows its changes (complete).
func (r *replication) copyReady() error {
	if r.complete() {
		return nil
	}
	return errors.New("the copy of the leader's replicated state is not complete")
}

func (r *replication) copiedRunsLocked() int { return r.copiedRuns }

// releaseLabels are the labels that make a Pod one of this relay's release (the chart's): a
// standby's Pod must carry the values this relay's own Pod carries.
var releaseLabels = []string{"app.kubernetes.io/name", "app.kubernetes.io/instance"}

// newReplication builds the replication on the Elector's answers: whether it leads, who holds
// the Lease, and, through the API, the holder's replication address and whether a standby's Pod
// is one of the release.
func (e *Elector) newReplication() (*replication, error) {
	self, pod := []string{e.cfg.Identity}, e.cfg.Identity
	if e.cfg.PodName != "" {
		self, pod = append(self, e.cfg.PodName), e.cfg.PodName
	}
	var ownMu sync.Mutex
	var own map[string]string // guarded by ownMu: this relay's Pod's release labels, once read
	ownLabels := func(ctx context.Context) (map[string]string, error) {
		ownMu.Lock()
		defer ownMu.Unlock()
		if own != nil || e.cfg.PodName == "" {
			return own, nil
		}
		p, err := e.cfg.Client.CoreV1().Pods(e.cfg.Namespace).Get(ctx, e.cfg.PodName, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		own = map[string]string{}
		for _, k := range releaseLabels {
			if v, ok := p.Labels[k]; ok {
				own[k] = v
			}
		}
		return own, nil
	}
	return newReplication(replicationConfig{listener: e.cfg.Replication, key: e.cfg.ReplicationKey, parts: e.cfg.Parts,
		self: self, pod: pod, maxCopy: e.cfg.MaxCopyBytes, ackTimeout: e.cfg.AckTimeout},
		replicationPorts{
			leading: func() bool { _, self := e.Holder(); return self && e.Held() },
			holder:  func() string { h, _ := e.Holder(); return h },
			address: func(ctx context.Context, holder string) (string, error) {
				actx, cancel := context.WithTimeout(ctx, apiTimeout)
				defer cancel()
				p, err := e.cfg.Client.CoreV1().Pods(e.cfg.Namespace).Get(actx, holder, metav1.GetOptions{})
				if err != nil {
					return "", err
				}
				addr := p.Annotations[ReplicationAnnotation]
				if addr == "" {
					return "", errors.New("ha: the holder's Pod names no replication address")
				}
				return addr, nil
			},
			checkPod: func(ctx context.Context, name string) error {
				want, err := ownLabels(ctx)
				if err != nil {
					return fmt.Errorf("read this relay's own Pod: %w", err)
				}
				p, err := e.cfg.Client.CoreV1().Pods(e.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				for k, v := range want {
					if p.Labels[k] != v {
						return fmt.Errorf("its label %s is not this release's", k)
					}
				}
				return nil
			},
		}, e.log, e.m)
}

// Sync calls done once every standby with a complete copy has acknowledged everything the
// replicated parts have sent so far — done(true) — or at once with none connected, or once one of
// them missed the --ha-replication-ack bound (it is closed) — done(false). It never blocks; done
// is called exactly once, from any goroutine. It implements feature.ReplicaSync: the escrow
// answers a hold from done.
func (e *Elector) Sync(done func(replicated bool)) { e.rep.sync(done) }

// UseMemory charges each standby's send queue to the relay's memory budget. Call it before Run.
func (e *Elector) UseMemory(m feature.Memory) { e.rep.useMemory(m) }
