package relay

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/status"
)

// Relay is one cluster relay: the upstream Cloudly session, the downstream listener carrying the
// cluster's nodes and ingress, and the parts. Relay wires them; each owns its own state. The
// admin listener and the status page are package status's, reading the relay's Snapshot.
type Relay struct {
	cfg     Config   // set at construction
	log     logs     // set at construction
	metrics *metrics // set at construction

	up      *upstream      // set at construction: the Cloudly session
	down    *downstream    // set at construction: every downstream connection and its bounds
	streams *streamTable   // set at construction: VirtualStreams bound to node connections
	parts   parts          // set at construction: which part hears each event and serves each method
	certs   *certReloader  // set at construction: the downstream certificate; nil with --insecure-plaintext
	admin   *status.Server // set at construction: the admin listener, which serves the status page

	custody  custody
	draining atomic.Bool    // shutting down: new requests are refused, those in flight finish
	elector  Elector        // set at construction: nil without HA, the relay leads from the start
	tenure   feature.Tenure // set at construction: the elector's, or always
	leading  atomic.Bool    // the relay acts for the cluster: dials Cloudly, admits downstream peers

	now    func() time.Time // set at construction: Options.Now, or time.Now
	downLn net.Listener     // set by Listen
}

// logs are the relay's component loggers.
type logs struct {
	relay   zerolog.Logger // component relay
	up      zerolog.Logger // the Cloudly session's
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
	// registration (docs/protocol.md#attaching); nil when the hub is off (nothing is reported).
	VPNHub *contracts.VPNHubEndpoint
	// VPNHubBound is the hub's UDP socket as bound (host:port), which the status page shows
	// beside the reported endpoint; empty: the page shows the reported one only.
	VPNHubBound string

	PingInterval time.Duration
	DeadTimeout  time.Duration
	CallTimeout  time.Duration // how long a forwarded request waits for its answer (60 s)
	// Bounds on downstream connections that have not registered; zero means the defaults
	// (MaxUnregistered, RegisterDeadline). Tests lower them.
	MaxUnregistered  int
	RegisterDeadline time.Duration
	// RegisteredShare is what one registered peer may hold of the peer memory budget (its send
	// queue's bytes too); zero means the default (RegisteredShare). Tests lower it, with
	// --max-message-bytes, so that filling a share takes megabytes instead of tens of them.
	RegisteredShare int64
	// AnonymousRegistrationBytes is what the registrations of connections that have not
	// registered may hold at Cloudly at once (the anonymous pool's bytes); zero means the default
	// (AnonymousRegistrationBytes). Tests lower it, so that filling the pool takes a few dozen
	// registrations instead of hundreds.
	AnonymousRegistrationBytes int64
	// MaxConnections caps the downstream connections open at once; zero: RLIMIT_NOFILE less a
	// reserve of 256 descriptors (none where the limit cannot be read).
	MaxConnections int
	// Elector runs the HA election (docs/ha.md); nil: the relay leads from the start.
	Elector Elector
	// Now is the clock the relay reads the time from — the session's history and the status
	// page, stream bindings' idleness, latencies it logs; nil is time.Now. Timers (the reconnect
	// backoff, the registration deadline) and socket deadlines run on the runtime's own clock:
	// tests drive those with testing/synctest.
	Now func() time.Time
}

// New builds a relay from a completed Config (Config.Complete) and its parts. It fails on a TLS
// pair it cannot load, on parts that serve one method twice, and when its metrics cannot be
// registered.
func New(cfg Config, feats Features, opts Options) (*Relay, error) {
	log := opts.Logger
	if opts.Now == nil {
		opts.Now = time.Now
	}
	r := &Relay{cfg: cfg, elector: opts.Elector, now: opts.Now,
		log: logs{
			relay:   log.With().Str("component", "relay").Logger(),
			up:      log.With().Str("component", "upstream").Logger(),
			refusal: log.With().Str("component", "upstream").Logger().Sample(&zerolog.BurstSampler{Burst: 20, Period: time.Second}),
		},
		streams: newStreamTable()}
	registry := opts.Registry
	if registry == nil {
		registry = NewRegistry()
	}
	if !cfg.InsecurePlaintext {
		// Loaded here, not in Serve, so that an unusable pair is a configuration error (exit 2
		// naming the flag) before anything binds.
		certs, err := newCertReloader(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, &ConfigError{Flag: "tls-cert-file", Reason: err.Error() + " (with --tls-key-file " + cfg.TLSKeyFile + ")"}
		}
		certs.now = opts.Now
		r.certs = certs
	}
	r.metrics = newMetrics()
	hub, err := newHubReporter(cfg.ClusterID, opts.VPNHub, opts.VPNHubBound, r.log.up, r.metrics.up.hubReports, opts.Now)
	if err != nil {
		return nil, err
	}
	t := timings{pingInterval: opts.PingInterval, deadTimeout: opts.DeadTimeout, callTimeout: opts.CallTimeout}
	r.down = newDownstream(downstreamConfig{
		maxMessageBytes: cfg.MaxMessageBytes, peerMemoryBytes: cfg.PeerMemoryBytes, maxPerSource: cfg.MaxUnregisteredPerSource,
		maxWaiting: int64(opts.MaxUnregistered), registerDeadline: opts.RegisterDeadline, registeredShare: opts.RegisteredShare, anonymousBytes: opts.AnonymousRegistrationBytes, maxConns: opts.MaxConnections, plaintext: cfg.InsecurePlaintext, timings: t,
		pace: paceOf(cfg), upgradeRate: cfg.UpgradeRatePerSource, upgradeBurst: cfg.UpgradeBurstPerSource,
		now: opts.Now,
	}, log.With().Str("component", "downstream").Logger(), r.metrics, downstreamHooks{
		serve: r.servePeer, serveStream: r.serveNodeStream, gone: r.peerGone, dropped: r.countDropped,
	})
	r.tenure = always{}
	if t, ok := opts.Elector.(feature.Tenure); ok {
		r.tenure = t
	}
	r.up = newUpstream(upstreamConfig{
		url: cfg.CloudlyURL, tokenFile: cfg.CloudlyTokenFile, roots: opts.CloudlyRoots, allowHTTP: cfg.InsecurePlaintext,
		readLimit: cfg.MaxMessageBytes, timings: t, tenure: r.tenure, hub: hub, local: newLocalStreams(r.down.budget), now: opts.Now,
	}, log, &r.metrics.up, upstreamHooks{
		serve: r.serveCloudly, serveStream: r.serveCloudlyStream, registration: r.registration, accepted: r.registrationAccepted,
		attached: r.upstreamAttached, detached: r.upstreamDetached, undispatched: r.undispatched, dropped: r.countDropped,
	})
	if r.parts, err = r.wireParts(feats); err != nil {
		return nil, err
	}
	var reg prometheus.Registerer = registry
	if opts.Registerer != nil {
		reg = opts.Registerer
	}
	if err := r.registerMetrics(reg); err != nil {
		return nil, err
	}
	r.admin = status.New(status.Config{Listen: cfg.AdminListen, Pprof: cfg.AdminPprof, Source: r, Registry: registry, Now: opts.Now,
		Logger: log.With().Str("component", "admin").Logger()})
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

// role is the relay's part in its cluster: leader or standby with HA (docs/ha.md), single without.
func (r *Relay) role() string {
	switch {
	case r.elector == nil:
		return status.RoleSingle
	case r.leading.Load():
		return status.RoleLeader
	}
	return status.RoleStandby
}

// Upstream is the Cloudly session as parts see it.
func (r *Relay) Upstream() feature.Upstream { return r.up }

// Listen binds the downstream and admin listeners. Downstream connections get no TCP keep-alive:
// every one is bounded by its own timeouts (WebSocket pings and the dead timeout, the HTTP
// server's), and the four socket options keep-alive takes cost four system calls for every
// connection accepted, an attacker's included (docs/hostile.md, "Refusal before work").
func (r *Relay) Listen() error {
	var err error
	lc := net.ListenConfig{KeepAlive: -1}
	if r.downLn, err = lc.Listen(context.Background(), "tcp", r.cfg.Listen); err != nil {
		return fmt.Errorf("listen %s: %w", r.cfg.Listen, err)
	}
	if err := r.admin.Listen(); err != nil {
		r.downLn.Close()
		return err
	}
	return nil
}

// DownstreamAddr and AdminAddr are the bound addresses (after Listen).
func (r *Relay) DownstreamAddr() net.Addr { return r.downLn.Addr() }
func (r *Relay) AdminAddr() net.Addr      { return r.admin.Addr() }

func (r *Relay) listenPort() int { return r.downLn.Addr().(*net.TCPAddr).Port }

// peerGone: a downstream connection ended. The parts hear it, and its streams end.
func (r *Relay) peerGone(p *peer) {
	for _, w := range r.parts.peerGone {
		w.PeerGone(p)
	}
	r.streams.peerGone(p, r.now())
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
