package relay

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/budget"
)

// ShutdownTimeout bounds a graceful shutdown: open connections get a close handshake until then.
const ShutdownTimeout = 5 * time.Second

// HTTP server bounds (SPEC §15).
const (
	headerTimeout    = 10 * time.Second
	idleTimeout      = 60 * time.Second
	maxAdminRequests = 16 // served at once on the admin listener; more are answered 503
)

// Relay is one cluster relay: the upstream Cloudly session, the downstream listener carrying the
// cluster's nodes and ingress, and the admin listener.
type Relay struct {
	cfg        Config         // set at construction
	log        zerolog.Logger // set at construction: component relay
	downLog    zerolog.Logger // set at construction: shared by every downstream connection
	upLog      zerolog.Logger // set at construction: the Cloudly session's
	adminLog   zerolog.Logger // set at construction: the admin listener's
	refusalLog zerolog.Logger // set at construction: sampled, for refusals a peer can repeat at will
	registry   *prometheus.Registry
	metrics    *metrics

	// The features, found out at New (features.go): the methods they serve are in dispatch, and
	// the relay tells observers what happens and runs components.
	dispatch   dispatch
	observers  []Observer
	components []part
	reporters  []part                    // parts with facts for the status page
	v2         http.Handler              // set at construction: registry forwarding under /v2/; nil: off
	vpnHub     *contracts.VPNHubEndpoint // set at construction: relay.vpnHub in the registration

	certs   *certReloader // set at construction: the downstream certificate; nil with --insecure-plaintext
	up      *upstream     // set at construction
	custody custody
	// registrations counts registerClusterRelay bodies made: the next registrationSequence.
	registrations atomic.Int64

	nodes   nodeTable
	peers   peerSet
	peerIDs atomic.Uint64
	streams *streamTable   // set at construction
	budget  *budget.Budget // set at construction: bytes held for downstream peers (SPEC §15)

	anonymous *anonymousPool // set at construction: registrations of unregistered connections
	// unregisteredCosts holds the own cost of every unregistered connection (peer.go), at most
	// 1/unregisteredPart of the budget; never evicted.
	unregisteredCosts *budget.Share
	sources           *sourceCounts // set at construction: unregistered connections per source address

	downLn, adminLn net.Listener // set by Listen
	serveCtx        context.Context
	draining        atomic.Bool // shutting down: new requests are refused, those in flight finish

	// Timings of every socket; zero means the SPEC §2 defaults. Tests shorten them.
	pingInterval, deadTimeout, callTimeout time.Duration

	waiting          atomic.Int64  // downstream connections without an accepted registration
	maxWaiting       int64         // set at construction: more are refused at the upgrade
	registerDeadline time.Duration // set at construction: a connection registers within it or is closed
}

// Options are how a Relay is built beyond its Config. The zero value is usable.
type Options struct {
	// Logger is the process's logger; the relay adds its components (relay, upstream, downstream).
	Logger zerolog.Logger
	// Registry serves /metrics; nil: a new one (NewRegistry).
	Registry *prometheus.Registry
	// Registerer is where the relay's metrics are registered; nil: Registry.
	Registerer prometheus.Registerer

	// CloudlyRoots verify Cloudly's certificate (--cloudly-ca-file, loaded by the caller); nil:
	// the system's roots.
	CloudlyRoots *x509.CertPool
	// VPNHub is what registerClusterRelay reports as relay.vpnHub: the bound hub's endpoint; nil
	// when the hub is off (reported as null).
	VPNHub *contracts.VPNHubEndpoint

	PingInterval time.Duration
	DeadTimeout  time.Duration
	CallTimeout  time.Duration // how long a forwarded request waits for its answer (60 s)
	// Bounds on downstream connections that have not registered; zero means the defaults
	// (MaxUnregistered, RegisterDeadline). Tests lower them.
	MaxUnregistered  int
	RegisterDeadline time.Duration
}

// New builds a relay from a completed Config (Config.Complete) and its features. It fails on a
// TLS pair it cannot load, on features that serve one method twice, and when its metrics cannot
// be registered.
func New(cfg Config, feats Features, opts Options) (*Relay, error) {
	log := opts.Logger
	r := &Relay{cfg: cfg, v2: feats.Registry, registry: opts.Registry, vpnHub: opts.VPNHub,
		log:          log.With().Str("component", "relay").Logger(),
		downLog:      log.With().Str("component", "downstream").Logger(),
		upLog:        log.With().Str("component", "upstream").Logger(),
		adminLog:     log.With().Str("component", "admin").Logger(),
		refusalLog:   log.With().Str("component", "upstream").Logger().Sample(&zerolog.BurstSampler{Burst: 20, Period: time.Second}),
		streams:      newStreamTable(),
		budget:       budget.New(cfg.PeerMemoryBytes),
		sources:      &sourceCounts{max: cfg.MaxUnregisteredPerSource, n: make(map[string]int)},
		pingInterval: opts.PingInterval, deadTimeout: opts.DeadTimeout, callTimeout: opts.CallTimeout,
		maxWaiting: int64(opts.MaxUnregistered), registerDeadline: opts.RegisterDeadline}
	if r.maxWaiting <= 0 {
		r.maxWaiting = MaxUnregistered
	}
	if r.registerDeadline <= 0 {
		r.registerDeadline = RegisterDeadline
	}
	if r.registry == nil {
		r.registry = NewRegistry()
	}
	if cfg.PeerMemoryBytes <= 0 { // a Config that was not completed
		r.budget = budget.New(DefaultPeerMemoryBytes)
	}
	r.anonymous = &anonymousPool{share: r.budget.NewShare(AnonymousRegistrationBytes, nil, nil)}
	r.unregisteredCosts = r.budget.NewShare(r.budget.Limit()/unregisteredPart, nil, nil)
	if !cfg.InsecurePlaintext {
		// Loaded here, not in Serve, so that an unusable pair is a configuration error (exit 2
		// naming the flag) before anything binds.
		certs, err := newCertReloader(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, &ConfigError{Flag: "tls-cert-file", Reason: err.Error() + " (with --tls-key-file " + cfg.TLSKeyFile + ")"}
		}
		r.certs = certs
	}
	r.nodes.byID = make(map[string]*peer)
	r.peers.byID = make(map[uint64]*peer)

	parts := partsOf(feats)
	d, err := r.newDispatch(parts)
	if err != nil {
		return nil, err
	}
	r.dispatch = d
	for _, pt := range parts {
		if pt.observer != nil {
			r.observers = append(r.observers, pt.observer)
		}
		if pt.component != nil {
			r.components = append(r.components, pt)
		}
		if pt.reporter != nil {
			r.reporters = append(r.reporters, pt)
		}
	}

	var reg prometheus.Registerer = r.registry
	if opts.Registerer != nil {
		reg = opts.Registerer
	}
	m, err := r.newMetrics(reg)
	if err != nil {
		return nil, err
	}
	r.metrics = m
	r.up = newUpstream(r, upstreamConfig{
		url: cfg.CloudlyURL, tokenFile: cfg.CloudlyTokenFile, roots: opts.CloudlyRoots, allowHTTP: cfg.InsecurePlaintext,
		readLimit: cfg.MaxMessageBytes, pingInterval: opts.PingInterval, deadTimeout: opts.DeadTimeout, callTimeout: opts.CallTimeout,
	}, log, &m.up)
	return r, nil
}

// countDropped counts a frame dropped without an answer, by reason.
func (r *Relay) countDropped(reason string) { r.metrics.dropped.WithLabelValues(reason).Inc() }

// NewRegistry is a metrics registry with the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Registry is the relay's metrics registry; features register their own metrics in it.
func (r *Relay) Registry() *prometheus.Registry { return r.registry }

// Upstream is the Cloudly session as features see it.
func (r *Relay) Upstream() Upstream { return r.up }

// Listen binds the downstream and admin listeners.
func (r *Relay) Listen() error {
	var err error
	if r.downLn, err = net.Listen("tcp", r.cfg.Listen); err != nil {
		return fmt.Errorf("listen %s: %w", r.cfg.Listen, err)
	}
	if r.adminLn, err = net.Listen("tcp", r.cfg.AdminListen); err != nil {
		r.downLn.Close()
		return fmt.Errorf("admin listen %s: %w", r.cfg.AdminListen, err)
	}
	return nil
}

// DownstreamAddr and AdminAddr are the bound addresses (after Listen).
func (r *Relay) DownstreamAddr() net.Addr { return r.downLn.Addr() }
func (r *Relay) AdminAddr() net.Addr      { return r.adminLn.Addr() }

func (r *Relay) listenPort() int { return r.downLn.Addr().(*net.TCPAddr).Port }

// Serve runs the relay until ctx ends, then shuts down within ShutdownTimeout: downstream
// connections get a close handshake (1001), the Cloudly session is closed, the components are
// stopped, listeners stop. A component that fails stops the relay the same way, and Serve returns
// its error.
func (r *Relay) Serve(ctx context.Context) error {
	serveCtx, cancelServe := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelServe()
	r.serveCtx = serveCtx

	// SPEC §15: idle 60 s, headers 10 s on both servers; /v2/ sets its own progress deadlines.
	down := &http.Server{Handler: http.HandlerFunc(r.serveDownstream), ReadHeaderTimeout: headerTimeout, IdleTimeout: idleTimeout,
		ErrorLog: newStdLogger(r.downLog),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, rawConnKey{}, c)
		}}
	admin := &http.Server{Handler: capRequests(r.adminHandler(), maxAdminRequests), ReadHeaderTimeout: headerTimeout,
		IdleTimeout: idleTimeout, ErrorLog: newStdLogger(r.adminLog)}
	downLn := r.downLn
	if r.certs != nil {
		downLn = tls.NewListener(downLn, &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.certs.get,
			NextProtos: []string{"http/1.1"}})
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ignoreClosed(down.Serve(downLn)) })
	g.Go(func() error { return ignoreClosed(admin.Serve(r.adminLn)) })
	r.up.start(serveCtx)
	// Components run until the relay has closed what they serve and observe: downstream
	// connections and the Cloudly session.
	compCtx, stopComponents := context.WithCancel(serveCtx)
	defer stopComponents()
	for _, c := range r.components {
		g.Go(func() error {
			if err := c.component.Run(compCtx); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			return nil
		})
	}
	g.Go(func() error { r.sweepStreams(gctx); return nil })
	r.log.Info().Str("listen", r.downLn.Addr().String()).Str("admin", r.adminLn.Addr().String()).
		Str("cloudly", redactURL(r.cfg.CloudlyURL)).Msg("relay serving")

	<-gctx.Done()
	r.log.Info().Msg("relay shutting down")
	deadline, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	begin := time.Now()
	step := func(what string) { r.log.Debug().Dur("latency", time.Since(begin)).Msg("shutdown: " + what) }
	down.Shutdown(deadline)
	step("listener closed")
	r.drain(ShutdownTimeout / 2)
	r.peers.closeAll(deadline)
	step("downstream connections closed")
	r.up.close(deadline)
	step("Cloudly session closed")
	stopComponents()
	admin.Shutdown(deadline)
	cancelServe()
	err := g.Wait()
	step("components stopped, done")
	return err
}

// Run is Listen then Serve.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.Listen(); err != nil {
		return err
	}
	return r.Serve(ctx)
}

// drain refuses new requests, tells every node and ingress connection the relay is detaching
// (pushRelayUpstreamChanged { attached: false }), and waits, at most max, for their answers and
// for every request in flight in either direction to be answered. A peer's requests sent before
// its answer to the push are read, and answered, before the connection closes; a peer that honours
// the push sends nothing after it. So a shutdown loses no request without an answer.
func (r *Relay) drain(max time.Duration) {
	r.draining.Store(true)
	deadline := time.Now().Add(max)
	var acks sync.WaitGroup
	body := json.RawMessage(`{"attached":false}`)
	for _, p := range r.peers.snapshot() {
		if p.roleIs(roleNone) {
			continue
		}
		acks.Add(1)
		p.Call(contracts.MethodPushRelayUpstreamChanged, body, func(json.RawMessage, error) { acks.Done() })
	}
	acked := make(chan struct{})
	go func() { acks.Wait(); close(acked) }()
	select {
	case <-acked:
	case <-time.After(time.Until(deadline)):
	}
	r.log.Debug().Dur("latency", max-time.Until(deadline)).Msg("shutdown: peers told, drain")
	for time.Now().Before(deadline) {
		busy := r.up.inflight()
		for _, p := range r.peers.snapshot() {
			busy += p.conn.Inflight()
		}
		if busy == 0 {
			r.log.Debug().Dur("latency", max-time.Until(deadline)).Msg("shutdown: nothing in flight")
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.log.Warn().Msg("shutdown: requests still in flight after the drain time")
}

// capRequests serves at most n requests at once; more are answered 503 at once.
func capRequests(h http.Handler, n int) http.Handler {
	slots := make(chan struct{}, n)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
			h.ServeHTTP(w, req)
		default:
			w.Header().Set("Retry-After", "1")
			http.Error(w, "too many admin requests at once", http.StatusServiceUnavailable)
		}
	})
}

// redactURL is u for a log line: scheme, host and path, never a query, fragment or userinfo,
// which may carry a credential.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return (&url.URL{Scheme: p.Scheme, Host: p.Host, Path: p.Path}).String()
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// adminHandler serves /healthz (the process is alive), /readyz (attached to Cloudly, and every
// component ready) and /metrics.
func (r *Relay) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := r.ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /status", r.serveStatusPage)
	mux.HandleFunc("GET /status.json", r.serveStatusJSON)
	return mux
}

// ready says why the relay cannot serve now: detached from Cloudly, or a component not ready.
func (r *Relay) ready() error {
	if !r.up.Attached() {
		return errors.New("upstream detached")
	}
	for _, c := range r.components {
		if err := c.component.Ready(); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return nil
}
