package daemon

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/escrow"
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/ha"
	"code.foss.global/serve.zone/relay/ingress"
	"code.foss.global/serve.zone/relay/registry"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/vpnhub"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

func cmdRun(ctx context.Context, version string, args []string, stderr io.Writer) error {
	rc, err := configure("run", version, args)
	if err != nil {
		return err
	}
	cfg := rc.cfg
	log := NewLogger(cfg.LogLevel, cfg.LogFormat, stderr)
	if limit := setMemoryLimit(); limit > 0 {
		log.Info().Int64("bytes", limit).Msg("Go memory limit set from the container's")
	}
	defer tuneGC(cfg.PeerMemoryBytes)()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, hub, err := BuildParts(cfg, relay.Options{Logger: log}, netip.Addr{}, electorOf(&rc.ha))
	if err != nil {
		return rc.src.explain(err)
	}
	if err := r.Listen(); err != nil {
		return err
	}
	on, off := rc.parts()
	ev := log.Info().Str("component", "relay").Str("version", version).Str("protocol", contracts.InterfacesVersion).
		Str("min_peer_protocol", contracts.MinimumPeerVersion).Str("listen", r.DownstreamAddr().String()).
		Str("admin", r.AdminAddr().String()).Str("advertise", cfg.AdvertiseAddress)
	if hub != nil {
		ev = ev.Str("hub", hub.Addr().String())
	}
	ev.Strs("on", on).Strs("off", off).Msg("relay starting")
	if err := r.Serve(ctx); !errors.Is(err, relay.ErrTermEnded) {
		return err
	}
	return nil // the relay logged why it exits: its container restarts it, a standby
}

// runConfig is what `relay run` and `relay check` are told, judged.
type runConfig struct {
	cfg Config
	ha  haConfig
	src sources // where each flag given came from
}

// configure parses and judges the flags of `relay run` (and `relay check`, which takes the same):
// the build version, every missing required flag at once, flags that need another, each value,
// and a token file that must hold a token. Nothing is dialled, bound or written.
func configure(name, version string, args []string) (*runConfig, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	rc := &runConfig{}
	runFlags(fs, &rc.cfg)
	haFlags(fs, &rc.ha)
	src, err := parse(fs, args)
	if err != nil {
		return nil, err
	}
	rc.src = src
	if err := checkBuildVersion(version); err != nil {
		return nil, err
	}
	if err := runRules.check(fs, src); err != nil {
		return nil, err
	}
	if err := rc.ha.complete(); err != nil {
		return nil, src.explain(err)
	}
	rc.cfg.BuildVersion = version
	if err := rc.cfg.Complete(); err != nil {
		return nil, src.explain(err)
	}
	// Read at every attach; an empty file would otherwise pass start-up and fail only at the
	// first dial. Its content is never quoted.
	if tok, err := os.ReadFile(rc.cfg.CloudlyTokenFile); err != nil || len(bytes.TrimSpace(tok)) == 0 {
		reason := rc.cfg.CloudlyTokenFile + " is empty: it must hold the relay's machine JWT"
		if err != nil {
			reason = "cannot read " + rc.cfg.CloudlyTokenFile
		}
		return nil, src.explain(&relay.ConfigError{Flag: "cloudly-token-file", Reason: reason})
	}
	return rc, nil
}

// parts names the optional parts this configuration turns on and off, for the start-up line and
// `relay check`.
func (rc *runConfig) parts() (on, off []string) {
	for _, p := range []struct {
		name string
		on   bool
	}{{"tls", !rc.cfg.InsecurePlaintext}, {"vpnhub", rc.cfg.HubListen != ""}, {"registry", rc.cfg.RegistryUpstream != ""},
		{"registry-cache", rc.cfg.RegistryUpstream != "" && rc.cfg.RegistryCacheDir != ""}, {"ha", rc.ha.on()}} {
		if p.on {
			on = append(on, p.name)
		} else {
			off = append(off, p.name)
		}
	}
	return append([]string{"escrow", "ingress", "restore", "platform"}, on...), off
}

// build wires the relay and its features from a completed configuration and opts.Logger, without
// HA, and with the daemon's defaults beside the core's Config (no extra CA roots, no registry
// cache). Features register their metrics in the relay's registry.
func build(cfg relay.Config, opts relay.Options) (*relay.Relay, error) {
	return buildWith(Config{Config: cfg, RegistryCacheMaxBytes: defaultRegistryCacheMaxBytes})(cfg, opts)
}

// buildWith is build with the daemon's own configuration dc beside the core's Config (which
// replaces dc's): what a test sets that `relay run` takes as flags.
func buildWith(dc Config) func(relay.Config, relay.Options) (*relay.Relay, error) {
	return func(cfg relay.Config, opts relay.Options) (*relay.Relay, error) {
		dc.Config = cfg
		r, _, err := BuildParts(dc, opts, netip.Addr{}, nil)
		return r, err
	}
}

// Elect builds the HA Elector for the parts it copies to its standbys (the escrow and the hub's
// membership); nil: no HA.
type Elect func(log zerolog.Logger, reg prometheus.Registerer, parts []ha.Part) (relay.Elector, error)

// BuildParts is build for callers that need the bound VPN hub as well (the demo, cmd/relay-dev,
// dials it on loopback) or an election (el; nil: no HA). devHubAddress, when valid, is what registerClusterVpnHub reports as the hub's address
// instead of the bound one: a dev hub binds loopback, which IRuntimeNetworkVpnHub refuses.
func BuildParts(cfg Config, opts relay.Options, devHubAddress netip.Addr, el Elect) (*relay.Relay, *vpnhub.Hub, error) {
	log := opts.Logger
	roots, err := caPool(cfg.CloudlyCAFile, "cloudly-ca-file")
	if err != nil {
		return nil, nil, err
	}
	opts.CloudlyRoots = roots
	if opts.Registry == nil {
		opts.Registry = relay.NewRegistry()
	}
	if opts.Registerer == nil {
		opts.Registerer = opts.Registry
	}
	var feats relay.Features
	cs, err := buildCorestore(cfg, log, opts.Registerer)
	if err != nil {
		return nil, nil, err
	}
	rs, err := buildRestore(cs, log, opts.Registerer)
	if err != nil {
		return nil, nil, err
	}
	in, err := ingress.New(ingress.Options{Logger: log, Registerer: opts.Registerer})
	if err != nil {
		return nil, nil, err
	}
	if cfg.RegistryUpstream != "" {
		roots, err := caPool(cfg.RegistryCAFile, "registry-ca-file")
		if err != nil {
			return nil, nil, err
		}
		reg, err := registry.New(registry.Options{
			Upstream: cfg.RegistryUpstream, CacheDir: cfg.RegistryCacheDir, CacheMaxBytes: cfg.RegistryCacheMaxBytes,
			Registerer: opts.Registerer, Logger: log, RootCAs: roots,
		})
		if errors.Is(err, registry.ErrUpstreamURL) {
			return nil, nil, &relay.ConfigError{Flag: "registry-upstream", Reason: err.Error()}
		}
		if err != nil {
			return nil, nil, err
		}
		feats.Registry = reg
	}
	esc, err := buildEscrow(log, opts.Registerer)
	if err != nil {
		return nil, nil, err
	}
	pf, err := buildPlatform(cs, log, opts.Registerer)
	if err != nil {
		return nil, nil, err
	}
	// The order the parts hear each event in, and are listed on the status page.
	feats.Parts = []relay.Part{{Name: "escrow", Impl: esc}, {Name: "ingress", Impl: in}, {Name: "restore", Impl: rs},
		{Name: "platform", Impl: pf}}
	// What an HA leader copies to its standbys, each part under a key prefix of its own.
	replicated := []ha.Part{{Prefix: escrow.ReplicationPrefix, Part: esc, Runs: escrow.ReplicatedRunPrefix}}
	var hub *vpnhub.Hub
	if cfg.HubListen != "" {
		var err error
		if hub, err = buildHub(cfg, log, opts.Registerer, devHubAddress); err != nil {
			return nil, nil, err
		}
		feats.Parts = append(feats.Parts, relay.Part{Name: "vpnhub", Impl: hub})
		ep := hub.Endpoint()
		opts.VPNHub = &ep // what registerClusterVpnHub reports: the hub is bound, its endpoint final
		opts.VPNHubBound = hub.Addr().String()
		// A standby's hub holds the leader's membership, served once it leads.
		replicated = append(replicated, ha.Part{Prefix: vpnhub.ReplicationPrefix, Part: hub})
	}
	closeHub := func() {
		if hub != nil {
			hub.Close()
		}
	}
	if el != nil {
		if opts.Elector, err = el(log, opts.Registerer, replicated); err != nil {
			closeHub()
			return nil, nil, err
		}
		// A hold is answered once the standbys have it.
		if s, ok := opts.Elector.(feature.ReplicaSync); ok {
			esc.UseReplicaSync(s)
		}
	}
	r, err := relay.New(cfg.Config, feats, opts)
	if err != nil {
		closeHub()
		return nil, nil, err
	}
	// The standbys' send queues are bytes held for peers: charged to the relay's memory budget.
	if u, ok := opts.Elector.(interface{ UseMemory(feature.Memory) }); ok {
		if m, ok := r.Upstream().(feature.Memory); ok {
			u.UseMemory(m)
		}
	}
	return r, hub, nil
}

// buildHub loads or creates the hub's static key and binds the hub, so that its endpoint is final
// before the relay registers and reports it. A listen address without a concrete IPv4 host and an unreadable key
// file are configuration errors naming their flag.
func buildHub(cfg Config, log zerolog.Logger, reg prometheus.Registerer, report netip.Addr) (*vpnhub.Hub, error) {
	if !report.IsValid() && cfg.HubAdvertiseAddress != "" {
		report = netip.MustParseAddr(cfg.HubAdvertiseAddress) // Complete checked it
	}
	if err := checkHubListen(cfg.HubListen, report); err != nil {
		return nil, err
	}
	key, err := vpnkey.LoadOrCreateFile(cfg.HubKeyFile, log.With().Str("component", "vpnhub").Logger())
	if err != nil {
		return nil, &relay.ConfigError{Flag: "hub-key-file", Reason: err.Error()}
	}
	hub, err := vpnhub.Listen(vpnhub.Config{Listen: cfg.HubListen, Key: key, ReportAddress: report},
		vpnhub.Options{Logger: log, Registerer: reg})
	if err != nil {
		return nil, fmt.Errorf("vpn hub: %w", err)
	}
	return hub, nil
}

// caPool is the system roots plus the PEM certificates in file; nil (the system roots) when file
// is empty. A file without a certificate is a usage error naming its flag.
func caPool(file, flag string) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, &relay.ConfigError{Flag: flag, Reason: "cannot read " + file}
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, &relay.ConfigError{Flag: flag, Reason: file + " holds no PEM certificate"}
	}
	return pool, nil
}

// checkHubListen judges --hub-listen: a concrete IPv4 host unless report (the address the hub
// report names instead) is valid.
func checkHubListen(listen string, report netip.Addr) error {
	at, err := vpnhub.ParseListen(listen)
	if err != nil {
		return &relay.ConfigError{Flag: "hub-listen", Reason: err.Error()}
	}
	if !report.IsValid() && !contracts.IsPlausibleUnicastIPv4(at.Addr().String()) {
		return &relay.ConfigError{Flag: "hub-listen", Reason: "must be a unicast IPv4 address that is neither loopback nor link-local: registerClusterVpnHub reports it to Cloudly for nodes to dial"}
	}
	return nil
}
