package restore

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
)

// Corestore is the port a Restore calls node Corestores through; cmd/relay wires the corestore
// package's client into it. Call posts control to <origin>/isolated-restore/<op> untouched and
// returns the 2xx answer's body; its errors should be *contracts.Refusal named
// restore-node-unreachable or restore-node-refused (anything else is answered as unreachable).
type Corestore interface {
	Call(ctx context.Context, origin, op string, control json.RawMessage) (json.RawMessage, error)
}

// Defaults of Options.
const (
	DefaultMaxInflightPerNode = 4
	DefaultMaxInflight        = 64
)

// Options configure a Restore; zero values mean the defaults.
type Options struct {
	// Logger is the relay's logger; New adds component "restore".
	Logger zerolog.Logger
	// Registerer receives the restore metrics; nil registers none.
	Registerer prometheus.Registerer
	// MaxInflightPerNode bounds the calls in flight to one node's Corestore; one more is refused
	// relay-node-busy at once.
	MaxInflightPerNode int
	// MaxInflight bounds the calls in flight to all Corestores together.
	MaxInflight int
}

// Restore serves the five isolated-restore methods; relay.go is how the relay reaches it.
type Restore struct {
	cs      Corestore       // set at construction
	opts    Options         // set at construction, defaults filled
	log     zerolog.Logger  // set at construction
	metrics *metrics        // set at construction
	ctx     context.Context // set at construction; cancelled by Close
	cancel  context.CancelFunc
	wg      sync.WaitGroup // calls in flight

	mu       sync.Mutex
	origins  map[string]string // guarded by mu: node id → Corestore origin, from the newest push
	inflight map[string]int    // guarded by mu: calls in flight per node
	total    int               // guarded by mu: calls in flight
	closed   bool              // guarded by mu
}

// New returns a Restore that reaches Corestores through cs. It fails only when its metrics cannot
// be registered.
func New(cs Corestore, opts Options) (*Restore, error) {
	if opts.MaxInflightPerNode <= 0 {
		opts.MaxInflightPerNode = DefaultMaxInflightPerNode
	}
	if opts.MaxInflight <= 0 {
		opts.MaxInflight = DefaultMaxInflight
	}
	r := &Restore{cs: cs, opts: opts, log: opts.Logger.With().Str("component", "restore").Logger(),
		origins: make(map[string]string), inflight: make(map[string]int)}
	m, err := newMetrics(opts.Registerer, r.inflightNow)
	if err != nil {
		return nil, fmt.Errorf("register restore metrics: %w", err)
	}
	r.metrics = m
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r, nil
}

// Close abandons the calls in flight (each is answered restore-node-unreachable), refuses new
// ones, and waits until every call has been answered. It never fails. Run calls it when the relay
// stops the restore.
func (r *Restore) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	return nil
}

// setCorestores replaces the Corestore origins (pushClusterRelayConfig's corestores). Calls in
// flight keep the origin they started with.
func (r *Restore) setCorestores(origins []contracts.CorestoreOrigin) {
	m := make(map[string]string, len(origins))
	for _, o := range origins {
		m[o.NodeID] = o.Origin
	}
	r.mu.Lock()
	r.origins = m
	r.mu.Unlock()
	r.metrics.corestores.Set(float64(len(m)))
	r.log.Info().Int("corestores", len(m)).Msg("Corestore origins replaced")
}

// Carried reports whether the relay knows node's Corestore origin.
func (r *Restore) Carried(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.origins[node]
	return ok
}

func (r *Restore) inflightNow() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return float64(r.total)
}

// Serve serves one of the five methods. It never blocks: everything up to the Corestore call is
// judged here, the call runs on its own goroutine, and reply is called exactly once.
func (r *Restore) Serve(method string, body json.RawMessage, reply func(json.RawMessage, error)) {
	start := time.Now()
	var node string
	op, ok := contracts.IsolatedRestoreCorestoreOp(method)
	done := func(answer json.RawMessage, err error) {
		r.finish(method, op, node, len(body), len(answer), err, start)
		reply(answer, err)
	}
	if !ok {
		done(nil, contracts.RelayMethodUnknown.Refuse("%s is not an isolated-restore method", method))
		return
	}
	// The control is not parsed: it is Corestore's to read and judge (docs/protocol.md#isolated-restore-and-corestore). The reader bounds
	// it by size alone.
	req, err := contracts.ReadIsolatedRestoreNodeControl(body)
	if err != nil {
		done(nil, invalidRequest(method, err))
		return
	}
	node = req.NodeID
	origin, err := r.acquire(node)
	if err != nil {
		done(nil, err)
		return
	}
	go func() {
		defer r.wg.Done()
		answer, err := r.call(origin, op, node, req.Control)
		// The slot is free before the node hears the answer: a node that calls again at once
		// must not find its previous call still counted against it.
		r.release(node)
		done(answer, err)
	}()
}

// call asks node's Corestore and projects its answer into the relay's.
func (r *Restore) call(origin, op, node string, control json.RawMessage) (json.RawMessage, error) {
	answer, err := r.cs.Call(r.ctx, origin, op, control)
	if err != nil {
		return nil, corestoreFailure(err)
	}
	progress, _, err := contracts.ProjectIsolatedRestoreProgress(node, answer)
	if err != nil {
		return nil, badSummary(err)
	}
	out := make([]byte, 0, len(progress)+14)
	out = append(out, `{"progress":`...)
	out = append(out, progress...)
	return append(out, '}'), nil
}

// acquire finds node's origin and takes a call slot, or says why not. A slot taken is released
// by release, and its call counted in wg until the caller has its answer.
func (r *Restore) acquire(node string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	origin, ok := r.origins[node]
	switch {
	case r.closed:
		return "", closing()
	case !ok:
		return "", notCarried(node)
	case r.inflight[node] >= r.opts.MaxInflightPerNode:
		return "", nodeBusy(node, r.inflight[node])
	case r.total >= r.opts.MaxInflight:
		return "", relayBusy(r.total)
	}
	r.inflight[node]++
	r.total++
	r.wg.Add(1)
	return origin, nil
}

func (r *Restore) release(node string) {
	r.mu.Lock()
	if r.inflight[node]--; r.inflight[node] == 0 {
		delete(r.inflight, node)
	}
	r.total--
	r.mu.Unlock()
}

// finish counts and logs one answered call: node, method, sizes and outcome, never a body or a
// reason. op is "" for a method that is not one of the five.
func (r *Restore) finish(method, op, node string, size, answerSize int, err error, start time.Time) {
	out := outcome(err)
	if op == "" {
		op = contracts.RefusalLabelOther
	}
	r.metrics.requests.WithLabelValues(op, out).Inc() // counted once: the status page lists it
	ev := r.log.Debug()
	if err != nil {
		ev = r.log.Info()
	}
	ev.Str("method", method).Str("node", node).Int("bytes", size).Int("answer_bytes", answerSize).
		Str("outcome", out).Dur("latency", time.Since(start)).Msg("isolated restore call")
}
