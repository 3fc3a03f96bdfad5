package main

import (
	"context"
	"flag"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/rs/zerolog"

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
	var feats relay.Features
	esc, err := buildEscrow(log, opts.Registry)
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
