package platform

import (
	"context"
	"crypto/ecdh"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"k8s.io/utils/clock"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// Corestore is the port the agent reaches node Corestores through; cmd/relay wires the corestore
// package's client into it. Every call carries the node's credential as its bearer; errors are
// *contracts.Refusal named restore-node-unreachable or restore-node-refused, relay-closure-stalled
// for a closure that stood still past its no-byte bound, or relay-request-invalid for a closure
// past the 256 MiB limit.
type Corestore interface {
	PutDesiredState(ctx context.Context, origin string, bearer contracts.Secret, body []byte) error
	ReadyBackups(ctx context.Context, origin string, bearer contracts.Secret) ([]byte, error)
	WantedRestores(ctx context.Context, origin string, bearer contracts.Secret) ([]byte, error)
	MarkDelivered(ctx context.Context, origin string, bearer contracts.Secret, backupID string) error
	// OpenBackupClosure starts reading a backup's closure (served as the backup media type).
	OpenBackupClosure(ctx context.Context, origin string, bearer contracts.Secret, backupID string) (io.ReadCloser, error)
	// PutRestoreClosure streams body into Corestore; a body whose Read fails aborts the request.
	PutRestoreClosure(ctx context.Context, origin string, bearer contracts.Secret, backupID string, descriptor []byte, body io.Reader) error
}

// Defaults of Options (project-defined, docs/platform.md).
const (
	DefaultStateInterval     = 60 * time.Second // desired state pulled this often while attached
	DefaultListInterval      = 30 * time.Second // backups and restores listed this often
	DefaultChunkBytes        = 256 << 10        // closure bytes per stream chunk
	DefaultMaxClosures       = 8                // closures in flight across all nodes (a node's first is admitted past it)
	DefaultMaxNodeClosures   = 2                // closures in flight for one node
	DefaultStreamIdle        = 60 * time.Second // a stream without a frame from Cloudly this long is aborted
	DefaultCredentialHorizon = 4 * time.Hour    // credentials dropped this long after a detach (the escrow horizon)
	DefaultCallTimeout       = 30 * time.Second // a Corestore listing or desired-state call
)

// Options configure an agent; zero values mean the defaults.
type Options struct {
	// Logger is the relay's logger; New adds component "platform".
	Logger zerolog.Logger
	// Registerer receives the platform metrics; nil registers none.
	Registerer prometheus.Registerer
	// Clock is the agent's time source: every cadence, bound and timer runs on it. Nil is the
	// wall clock; tests inject a fake one.
	Clock clock.WithTickerAndDelayedExecution

	StateInterval     time.Duration
	ListInterval      time.Duration
	ChunkBytes        int
	MaxClosures       int
	MaxNodeClosures   int
	StreamIdle        time.Duration
	CredentialHorizon time.Duration
	CallTimeout       time.Duration
	// MaxClosureBytes is the most a closure may carry; one past it is aborted and refused
	// relay-request-invalid. Zero, or anything above it, is the Corestore closure limit
	// (contracts.MaxCorestoreClosureBytes, 256 MiB): it can only be lowered.
	MaxClosureBytes int64
}

func (o *Options) fill() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.StateInterval, DefaultStateInterval)
	def(&o.ListInterval, DefaultListInterval)
	def(&o.StreamIdle, DefaultStreamIdle)
	def(&o.CredentialHorizon, DefaultCredentialHorizon)
	def(&o.CallTimeout, DefaultCallTimeout)
	if o.ChunkBytes <= 0 {
		o.ChunkBytes = DefaultChunkBytes
	}
	if o.MaxClosures <= 0 {
		o.MaxClosures = DefaultMaxClosures
	}
	if o.MaxClosureBytes <= 0 || o.MaxClosureBytes > contracts.MaxCorestoreClosureBytes {
		o.MaxClosureBytes = contracts.MaxCorestoreClosureBytes
	}
	if o.MaxNodeClosures <= 0 {
		o.MaxNodeClosures = DefaultMaxNodeClosures
	}
}

// Platform is the agent; feature.go is how the relay reaches it.
type Platform struct {
	cs      Corestore                           // set at construction
	opts    Options                             // set at construction, defaults filled
	clock   clock.WithTickerAndDelayedExecution // set at construction: opts.Clock, or the wall clock
	log     zerolog.Logger                      // set at construction
	metrics *metrics                            // set at construction
	ctx     context.Context                     // set at construction; cancelled by Close
	cancel  context.CancelFunc                  // set at construction
	wg      sync.WaitGroup                      // every goroutine the agent started
	slots   *slots                              // set at construction: the closures in flight, shared fairly (slots.go)
	pull    chan struct{}                       // set at construction, capacity 1: pull the desired state now

	// The relay's ports, set by UseUpstream before anything runs; streams and memory are nil
	// when the upstream does not offer them (then no closure is carried).
	up      feature.Upstream
	streams feature.Streams
	memory  feature.Memory

	mu         sync.Mutex
	nodes      map[string]*node // guarded by mu: the nodes the newest configuration names a Corestore for
	attached   bool             // guarded by mu
	session    uint64           // guarded by mu: counts attaches; work of an older one is stale
	enrolled   uint64           // guarded by mu: the session whose enrollment completed; 0 none
	enrolling  uint64           // guarded by mu: the session whose enrollment is under way
	recipient  *ecdh.PrivateKey // guarded by mu: the key of the newest enrollment; nil detached
	dropTimer  clock.Timer      // guarded by mu: drops credentials a horizon after a detach
	revision   int64            // guarded by mu: desired states pulled and read
	lastPull   string           // guarded by mu: outcome of the last pull
	closed     bool             // guarded by mu
	standby    bool             // guarded by mu: the relay does not lead (docs/ha.md): no node is worked for
	enrollment string           // guarded by mu: outcome of the newest enrollment
}

// New returns an agent that reaches Corestores through cs. It fails only when its metrics cannot
// be registered.
func New(cs Corestore, opts Options) (*Platform, error) {
	opts.fill()
	p := &Platform{cs: cs, opts: opts, log: opts.Logger.With().Str("component", "platform").Logger(),
		slots: newSlots(opts.MaxNodeClosures, opts.MaxClosures), pull: make(chan struct{}, 1), nodes: make(map[string]*node)}
	m, err := newMetrics(opts.Registerer, p.inflightNow)
	if err != nil {
		return nil, fmt.Errorf("register platform metrics: %w", err)
	}
	p.metrics = m
	if p.clock = opts.Clock; p.clock == nil {
		p.clock = clock.RealClock{}
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

// Close stops every node's work (closures in flight are aborted), drops every credential and key,
// and waits for the agent's goroutines. It never fails.
func (p *Platform) Close() error {
	p.mu.Lock()
	p.closed = true
	nodes := p.nodes
	p.nodes = map[string]*node{}
	p.recipient = nil
	if p.dropTimer != nil {
		p.dropTimer.Stop()
	}
	p.mu.Unlock()
	p.cancel()
	for _, n := range nodes {
		n.stop()
	}
	p.wg.Wait()
	return nil
}

// go runs f on a goroutine the agent waits for at Close.
func (p *Platform) goDo(f func()) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f()
	}()
}

func (p *Platform) inflightNow() float64 { return float64(p.slots.inflight()) }

// current reports whether session is still the attached one, on a relay that leads.
func (p *Platform) current(session uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.attached && p.session == session && !p.closed && !p.standby
}

// isStandby reports whether the relay does not lead. Lock order: p.mu, then a node's mu; never
// call it with a node's mu held.
func (p *Platform) isStandby() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.standby
}

// call calls Cloudly and waits for its answer until ctx ends.
func (p *Platform) call(ctx context.Context, method string, body []byte) ([]byte, error) {
	type answer struct {
		body []byte
		err  error
	}
	ch := make(chan answer, 1)
	p.up.Call(method, body, func(b json.RawMessage, err error) { ch <- answer{b, err} })
	select {
	case a := <-ch:
		return a.body, a.err
	case <-ctx.Done():
		return nil, contracts.RelayUpstreamDetached.Refuse("the platform agent stopped waiting for %s", method)
	}
}

// withTimeout is context.WithTimeout on the agent's clock: ended d after now, with
// context.DeadlineExceeded as its Err, as a timeout is.
func (p *Platform) withTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	inner, cancel := context.WithCancel(parent)
	ctx := &timeoutCtx{Context: inner}
	t := p.clock.AfterFunc(d, func() {
		ctx.fired.Store(true)
		cancel()
	})
	return ctx, func() {
		t.Stop()
		cancel()
	}
}

// timeoutCtx is a context its clock's timer ended.
type timeoutCtx struct {
	context.Context
	fired atomic.Bool
}

func (c *timeoutCtx) Err() error {
	err := c.Context.Err()
	if err != nil && c.fired.Load() && c.Context.Err() == context.Canceled {
		return context.DeadlineExceeded
	}
	return err
}

// kickPull asks for the desired state now.
func (p *Platform) kickPull() {
	select {
	case p.pull <- struct{}{}:
	default:
	}
}
