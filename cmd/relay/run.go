package main

import (
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
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/ingress"
	"code.foss.global/serve.zone/relay/registry"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/vpnhub"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

func cmdRun(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var cfg relay.Config
	var hc haConfig
	runFlags(fs, &cfg)
	haFlags(fs, &hc)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := hc.complete(); err != nil {
		return err
	}
	if err := checkBuildVersion(); err != nil {
		return err
	}
	cfg.BuildVersion = buildVersion
	if err := cfg.Complete(); err != nil {
		return err
	}
	log := newLogger(cfg.LogLevel, cfg.LogFormat, stderr)
	if limit := setMemoryLimit(); limit > 0 {
		log.Info().Int64("bytes", limit).Msg("Go memory limit set from the container's")
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, _, err := buildParts(cfg, relay.Options{Logger: log}, netip.Addr{}, electorOf(&hc))
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// build wires the relay and its features from a completed configuration and opts.Logger, without
// HA. Features register their metrics in the relay's registry.
func build(cfg relay.Config, opts relay.Options) (*relay.Relay, error) {
	r, _, err := buildParts(cfg, opts, netip.Addr{}, nil)
	return r, err
}

// elect builds the HA Elector for the part it copies (escrow); nil: no HA.
type elect func(log zerolog.Logger, reg prometheus.Registerer, rep feature.Replicated) (relay.Elector, error)

// buildParts is build for callers that need the bound VPN hub as well (`relay dev` dials it on
// loopback). devHubAddress, when valid, is what registerClusterVpnHub reports as the hub's address
// instead of the bound one: a dev hub binds loopback, which IRuntimeNetworkVpnHub refuses.
func buildParts(cfg relay.Config, opts relay.Options, devHubAddress netip.Addr, el elect) (*relay.Relay, *vpnhub.Hub, error) {
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
			return nil, nil, usagef("--registry-upstream: %v", err)
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
	if el != nil {
		if opts.Elector, err = el(log, opts.Registerer, esc); err != nil {
			return nil, nil, err
		}
	}
	var hub *vpnhub.Hub
	if cfg.HubListen != "" {
		var err error
		if hub, err = buildHub(cfg, log, opts.Registerer, devHubAddress); err != nil {
			return nil, nil, err
		}
		feats.Parts = append(feats.Parts, relay.Part{Name: "vpnhub", Impl: hub})
		ep := hub.Endpoint()
		opts.VPNHub = &ep // what registerClusterVpnHub reports: the hub is bound, its endpoint final
	}
	r, err := relay.New(cfg, feats, opts)
	if err != nil {
		if hub != nil {
			hub.Close()
		}
		return nil, nil, err
	}
	return r, hub, nil
}

// buildHub loads or creates the hub's static key and binds the hub, so that its endpoint is final
// before the relay registers and reports it. A listen address without a concrete IPv4 host and an unreadable key
// file are configuration errors naming their flag.
func buildHub(cfg relay.Config, log zerolog.Logger, reg prometheus.Registerer, report netip.Addr) (*vpnhub.Hub, error) {
	if !report.IsValid() && cfg.HubAdvertiseAddress != "" {
		report = netip.MustParseAddr(cfg.HubAdvertiseAddress) // Complete checked it
	}
	at, err := vpnhub.ParseListen(cfg.HubListen)
	if err != nil {
		return nil, &relay.ConfigError{Flag: "hub-listen", Reason: err.Error()}
	}
	if !report.IsValid() && !contracts.IsPlausibleUnicastIPv4(at.Addr().String()) {
		return nil, &relay.ConfigError{Flag: "hub-listen", Reason: "must be a unicast IPv4 address that is neither loopback nor link-local: registerClusterVpnHub reports it to Cloudly for nodes to dial"}
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
		return nil, usagef("--%s: cannot read %s", flag, file)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, usagef("--%s: %s holds no PEM certificate", flag, file)
	}
	return pool, nil
}
