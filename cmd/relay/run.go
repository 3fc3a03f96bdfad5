package main

import (
	"context"
	"crypto/x509"
	"flag"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/ingress"
	"code.foss.global/serve.zone/relay/registry"
	"code.foss.global/serve.zone/relay/relay"
)

func cmdRun(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var cfg relay.Config
	runFlags(fs, &cfg)
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg.BuildVersion = buildVersion
	if err := cfg.Complete(); err != nil {
		return err
	}
	log := newLogger(cfg.LogLevel, cfg.LogFormat, stderr)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := build(cfg, log, relay.Options{})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// build wires the relay and its features from a completed configuration. Features register their
// metrics in the relay's registry.
func build(cfg relay.Config, log zerolog.Logger, opts relay.Options) (*relay.Relay, error) {
	if opts.Registry == nil {
		opts.Registry = relay.NewRegistry()
	}
	if opts.Registerer == nil {
		opts.Registerer = opts.Registry
	}
	var feats relay.Features
	rs, err := buildRestore(cfg, log, opts.Registerer)
	if err != nil {
		return nil, err
	}
	feats.Restore = rs
	in, err := ingress.New(ingress.Config{Registry: opts.Registerer, Log: log})
	if err != nil {
		return nil, err
	}
	feats.Ingress = in
	if cfg.RegistryUpstream != "" {
		roots, err := caPool(cfg.RegistryCAFile, "registry-ca-file")
		if err != nil {
			return nil, err
		}
		reg, err := registry.New(registry.Options{
			Upstream: cfg.RegistryUpstream, CacheDir: cfg.RegistryCacheDir, CacheMaxBytes: cfg.RegistryCacheMaxBytes,
			Metrics: opts.Registerer, Log: log.With().Str("component", "registry").Logger(), RootCAs: roots,
		})
		if err != nil {
			return nil, usagef("--registry-upstream: %v", err)
		}
		feats.Registry = reg
	}
	esc, err := buildEscrow(log, opts.Registerer)
	if err != nil {
		return nil, err
	}
	feats.Escrow = esc
	return relay.New(cfg, feats, log, opts)
}

func newLogger(level, format string, w io.Writer) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	if format == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger()
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
