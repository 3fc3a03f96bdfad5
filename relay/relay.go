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
	"net/http/pprof"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// ShutdownTimeout bounds a graceful shutdown: open connections get a close handshake until then.
const ShutdownTimeout = 5 * time.Second

// HTTP server bounds (SPEC §15).
const (
	headerTimeout    = 10 * time.Second
	idleTimeout      = 60 * time.Second
	maxHeaderBytes   = 16 << 10
	maxAdminRequests = 16 // served at once on the admin listener; more are answered 503
)

// Relay is one cluster relay: the upstream Cloudly session, the downstream listener carrying the
// cluster's nodes and ingress, the parts, and the admin listener. Relay wires them; each owns its
// own state.
type Relay struct {
	cfg      Config               // set at construction
	log      logs                 // set at construction
	registry *prometheus.Registry // set at construction: served on /metrics
	metrics  *metrics             // set at construction

	up        *upstream     // set at construction: the Cloudly session
	down      *downstream   // set at construction: every downstream connection and its bounds
	streams   *streamTable  // set at construction: VirtualStreams bound to node connections
	parts     parts         // set at construction: the enabled parts, by what each hears and does
	dispatch  dispatch      // set at construction: which handler serves a method, per side
	v2        http.Handler  // set at construction: registry forwarding under /v2/; nil: off
	hubReport *hubReporter  // set at construction: registerClusterVpnHub after each accepted registration
	certs     *certReloader // set at construction: the downstream certificate; nil with --insecure-plaintext
	started   time.Time     // set at construction: the status page's uptime counts from it
	hubAddr   string        // set at construction: the VPN hub's reported address:port; empty while off
	rates     counterRates  // samples of the counters for the status page's rates (counters.go)

	custody custody
	// registrations counts registerClusterRelay bodies made: the next registrationSequence.
	registrations atomic.Int64
	draining      atomic.Bool    // shutting down: new requests are refused, those in flight finish
	elector       Elector        // set at construction: nil without HA, the relay leads from the start
	tenure        feature.Tenure // set at construction: the elector's, or always
	leading       atomic.Bool    // the relay acts for the cluster: dials Cloudly, admits downstream peers

	downLn, adminLn net.Listener // set by Listen
}

// logs are the relay's component loggers.
type logs struct {
	relay   zerolog.Logger // component relay
	up      zerolog.Logger // the Cloudly session's
	admin   zerolog.Logger // the admin listener's
	refusal zerolog.Logger // sampled, for refusals a peer can repeat at will
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
	// VPNHub is the bound hub's endpoint, which registerClusterVpnHub reports after each accepted
	// registration (SPEC §4 step 2); nil when the hub is off (nothing is reported).
	VPNHub *contracts.VPNHubEndpoint

	PingInterval time.Duration
	DeadTimeout  time.Duration
	CallTimeout  time.Duration // how long a forwarded request waits for its answer (60 s)
	// Bounds on downstream connections that have not registered; zero means the defaults
	// (MaxUnregistered, RegisterDeadline). Tests lower them.
	MaxUnregistered  int
	RegisterDeadline time.Duration
	// MaxConnections caps the downstream connections open at once; zero: RLIMIT_NOFILE less a
	// reserve of 256 descriptors (none where the limit cannot be read).
	MaxConnections int
	// Elector runs the HA election (SPEC §16); nil: the relay leads from the start.
	Elector Elector
}

// New builds a relay from a completed Config (Config.Complete) and its parts. It fails on a TLS
// pair it cannot load, on parts that serve one method twice, and when its metrics cannot be
// registered.
func New(cfg Config, feats Features, opts Options) (*Relay, error) {
	log := opts.Logger
	r := &Relay{cfg: cfg, v2: feats.Registry, registry: opts.Registry, elector: opts.Elector,
		log: logs{
			relay:   log.With().Str("component", "relay").Logger(),
			up:      log.With().Str("component", "upstream").Logger(),
			admin:   log.With().Str("component", "admin").Logger(),
			refusal: log.With().Str("component", "upstream").Logger().Sample(&zerolog.BurstSampler{Burst: 20, Period: time.Second}),
		},
		streams: newStreamTable(), started: time.Now()}
	if h := opts.VPNHub; h != nil {
		r.hubAddr = net.JoinHostPort(h.Address, strconv.Itoa(h.QUICPort))
	}
	if r.registry == nil {
		r.registry = NewRegistry()
	}
	if !cfg.InsecurePlaintext {
		// Loaded here, not in Serve, so that an unusable pair is a configuration error (exit 2
		// naming the flag) before anything binds.
		certs, err := newCertReloader(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, &ConfigError{Flag: "tls-cert-file", Reason: err.Error() + " (with --tls-key-file " + cfg.TLSKeyFile + ")"}
		}
		r.certs = certs
	}
	list := feats.withRegistry()
	d, err := r.newDispatch(list)
	if err != nil {
		return nil, err
	}
	r.dispatch = d
	r.metrics = newMetrics()
	if r.hubReport, err = newHubReporter(cfg.ClusterID, opts.VPNHub, r.log.up, r.metrics.up.hubReports); err != nil {
		return nil, err
	}
	t := timings{pingInterval: opts.PingInterval, deadTimeout: opts.DeadTimeout, callTimeout: opts.CallTimeout}
	r.down = newDownstream(downstreamConfig{
		maxMessageBytes: cfg.MaxMessageBytes, peerMemoryBytes: cfg.PeerMemoryBytes, maxPerSource: cfg.MaxUnregisteredPerSource,
		maxWaiting: int64(opts.MaxUnregistered), registerDeadline: opts.RegisterDeadline, maxConns: opts.MaxConnections, plaintext: cfg.InsecurePlaintext, timings: t,
		pace: paceOf(cfg), upgradeRate: cfg.UpgradeRatePerSource, upgradeBurst: cfg.UpgradeBurstPerSource,
	}, log.With().Str("component", "downstream").Logger(), r.metrics, downstreamHooks{
		serve: r.servePeer, serveStream: r.serveNodeStream, gone: r.peerGone, dropped: r.countDropped,
	})
	r.up = newUpstream(r, upstreamConfig{
		url: cfg.CloudlyURL, tokenFile: cfg.CloudlyTokenFile, roots: opts.CloudlyRoots, allowHTTP: cfg.InsecurePlaintext,
		readLimit: cfg.MaxMessageBytes, timings: t,
	}, log, &r.metrics.up)
	r.up.local = newLocalStreams(r.down.budget)
	var reg prometheus.Registerer = r.registry
	if opts.Registerer != nil {
		reg = opts.Registerer
	}
	if err := r.registerMetrics(reg); err != nil {
		return nil, err
	}
	r.tenure = always{}
	if t, ok := opts.Elector.(feature.Tenure); ok {
		r.tenure = t
	}
	r.up.tenure = r.tenure
	r.parts = sortParts(list, r.up, r.tenure)
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

// role is the relay's part in its cluster: leader or standby with HA (SPEC §16), single without.
func (r *Relay) role() string {
	switch {
	case r.elector == nil:
		return "single"
	case r.leading.Load():
		return "leader"
	}
	return "standby"
}

// Upstream is the Cloudly session as parts see it.
func (r *Relay) Upstream() feature.Upstream { return r.up }

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
	r.down.ctx = serveCtx

	// SPEC §15: idle 60 s, headers 10 s and 16 KiB on both servers; /v2/ sets its own progress
	// deadlines; every downstream connection is admitted (admission.go) before TLS.
	down := &http.Server{Handler: http.HandlerFunc(r.serveDownstream), ReadHeaderTimeout: headerTimeout, IdleTimeout: idleTimeout,
		MaxHeaderBytes: maxHeaderBytes, ErrorLog: newStdLogger(r.down.log),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, rawConnKey{}, c)
		}}
	admin := &http.Server{Handler: capRequests(r.adminHandler(), maxAdminRequests), ReadHeaderTimeout: headerTimeout,
		IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes, ErrorLog: newStdLogger(r.log.admin)}
	var downLn net.Listener = listener{Listener: r.downLn, a: r.down.adm}
	if r.certs != nil {
		downLn = tls.NewListener(downLn, &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.certs.get,
			NextProtos: []string{"http/1.1"}})
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ignoreClosed(down.Serve(downLn)) })
	g.Go(func() error { return ignoreClosed(admin.Serve(r.adminLn)) })
	elected := make(chan struct{}) // closed when the election has returned
	var termEnded atomic.Bool      // the election returned because the term ended
	electCtx, stopElection := context.WithCancel(serveCtx)
	defer stopElection()
	if r.elector == nil {
		close(elected)
		r.startLeading()
	} else {
		for _, w := range r.parts.lead {
			w.Leading(false) // a standby until elected
		}
		g.Go(func() error {
			defer close(elected)
			if err := r.elector.Run(electCtx, r.leadWhile); err != nil {
				return fmt.Errorf("election: %w", err)
			}
			if electCtx.Err() == nil {
				termEnded.Store(true)
				return ErrTermEnded // ends the relay as an error would: the group's context is done
			}
			return nil
		})
	}
	// Components run until the relay has closed what they serve and observe: downstream
	// connections and the Cloudly session.
	compCtx, stopComponents := context.WithCancel(serveCtx)
	defer stopComponents()
	for _, c := range r.parts.components {
		g.Go(func() error {
			if err := c.v.Run(compCtx); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			return nil
		})
	}
	g.Go(func() error { r.sweepStreams(gctx); return nil })
	g.Go(func() error { r.sampleCounters(gctx); return nil })
	r.log.relay.Info().Str("listen", r.downLn.Addr().String()).Str("admin", r.adminLn.Addr().String()).
		Str("cloudly", redactURL(r.cfg.CloudlyURL)).Msg("relay serving")

	<-gctx.Done()
	if termEnded.Load() {
		r.log.relay.Info().Str("outcome", "exit").Msg(ErrTermEnded.Error())
	}
	r.log.relay.Info().Msg("relay shutting down")
	deadline, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	begin := time.Now()
	step := func(what string) { r.log.relay.Debug().Dur("latency", time.Since(begin)).Msg("shutdown: " + what) }
	down.Shutdown(deadline)
	step("listener closed")
	r.drain(ShutdownTimeout / 2)
	if r.elector != nil {
		// Stepping down (SPEC §16): Cloudly's socket closed first, the Lease released and the Pod
		// relabelled by the election's end, and only then the downstream connections, so that
		// nodes find the new leader attached or attaching.
		r.fence("stepping down")
		step("Cloudly session closed")
		stopElection()
		<-elected
		step("Lease released")
	}
	r.down.peers.closeAll(deadline)
	step("downstream connections closed")
	r.up.close(deadline, "relay shutting down")
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

// serveDownstream serves the downstream listener: /v2/ to registry forwarding, a WebSocket
// upgrade on every other path. Any other plain HTTP request is answered and its connection
// closed, so that an anonymous client holds no idle keep-alive connection outside every
// WebSocket bound.
func (r *Relay) serveDownstream(w http.ResponseWriter, req *http.Request) {
	if !r.leading.Load() {
		refuseStandby(w)
		return
	}
	if req.URL.Path == "/v2" || strings.HasPrefix(req.URL.Path, "/v2/") {
		if r.v2 == nil {
			w.Header().Set("Connection", "close")
			http.Error(w, "registry forwarding is off on this relay", http.StatusNotFound)
			return
		}
		r.v2.ServeHTTP(w, req)
		return
	}
	if !isWebSocketUpgrade(req) {
		w.Header().Set("Connection", "close")
		w.Header().Set("Upgrade", "websocket")
		http.Error(w, "this endpoint serves TypedRequest over WebSocket", http.StatusUpgradeRequired)
		return
	}
	r.down.accept(w, req)
}

// peerGone: a downstream connection ended. The parts hear it, and its streams end.
func (r *Relay) peerGone(p *peer) {
	for _, w := range r.parts.peerGone {
		w.PeerGone(p)
	}
	r.streams.peerGone(p, time.Now())
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
	for _, p := range r.down.carried() {
		acks.Add(1)
		p.Call(contracts.MethodPushRelayUpstreamChanged, body, func(json.RawMessage, error) { acks.Done() })
	}
	acked := make(chan struct{})
	go func() { acks.Wait(); close(acked) }()
	select {
	case <-acked:
	case <-time.After(time.Until(deadline)):
	}
	r.log.relay.Debug().Dur("latency", max-time.Until(deadline)).Msg("shutdown: peers told, drain")
	for time.Now().Before(deadline) {
		if r.up.inflight()+r.down.inflight() == 0 {
			r.log.relay.Debug().Dur("latency", max-time.Until(deadline)).Msg("shutdown: nothing in flight")
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.log.relay.Warn().Msg("shutdown: requests still in flight after the drain time")
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
// component ready; the body says why not), /metrics, /status and /status.json, and with
// --admin-pprof net/http/pprof under /debug/pprof/.
func (r *Relay) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := r.ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if r.elector != nil && !r.leading.Load() {
			fmt.Fprintln(w, "ready: standby, could lead")
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /status", r.serveStatusPage)
	mux.HandleFunc("GET /status.json", r.serveStatusJSON)
	if r.cfg.AdminPprof {
		// The profiles say what the relay does, not what it carries; the admin listener is on
		// loopback by default, and this is off unless asked for.
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// ready says why the relay cannot serve now: shutting down, detached from Cloudly (and why), or
// a component not ready. An HA standby is ready while it could lead.
func (r *Relay) ready() error {
	switch {
	case r.draining.Load():
		return errors.New("shutting down")
	case r.elector != nil && !r.leading.Load():
		if err := r.elector.Ready(); err != nil {
			return fmt.Errorf("standby: %w", err)
		}
	case !r.up.Attached():
		return errors.New("detached: " + r.up.hist.history().detachedReason(time.Now()))
	}
	for _, c := range r.parts.components {
		if err := c.v.Ready(); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return nil
}
