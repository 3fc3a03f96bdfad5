package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"code.foss.global/serve.zone/relay/internal/sim"
	"code.foss.global/serve.zone/relay/relay"
)

// cmdDev runs the relay with simulated peers on loopback and prints what they observe.
func cmdDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	nodes := fs.Int("nodes", 20, "simulated nodes")
	duration := fs.Duration("duration", 0, "stop after this long (0: until Ctrl-C)")
	logLevel := fs.String("log-level", "warn", "relay log level")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *nodes < 1 || *nodes > 100_000 {
		return usagef("--nodes: must be from 1 to 100000")
	}
	if *duration < 0 {
		return usagef("--duration: must not be negative (0: until Ctrl-C)")
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	log := newLogger(*logLevel, "console", stderr)

	cloudly, err := sim.NewCloudly(log)
	if err != nil {
		return err
	}
	defer cloudly.Close()
	dir, err := os.MkdirTemp("", "relay-dev-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	tokenFile := filepath.Join(dir, "cloudly.jwt")
	if err := os.WriteFile(tokenFile, []byte(cloudly.Token+"\n"), 0o600); err != nil {
		return err
	}
	sc, err := sim.NewScenario(*nodes, cloudly, log)
	if err != nil {
		return err
	}
	defer sc.Close()
	cfg := relay.Config{
		ClusterID: cloudly.ClusterID, NodeID: "relay-node", CloudlyURL: cloudly.URL(), CloudlyTokenFile: tokenFile,
		Listen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: "127.0.0.1:0",
		LogLevel: *logLevel, LogFormat: "console", BuildVersion: buildVersion,
	}
	cfg.HubListen, cfg.HubKeyFile = "127.0.0.1:0", filepath.Join(dir, "hub.key")
	if err := cfg.Complete(); err != nil {
		return err
	}
	// The hub binds loopback; the registration reports the advertise address, which Cloudly accepts.
	r, hub, err := buildParts(cfg, relay.Options{Logger: log}, netip.MustParseAddr(cfg.AdvertiseAddress))
	if err != nil {
		return err
	}
	sc.HubAddr = hub.Addr()
	if _, sc.HubKey, err = sim.HubTarget(hub.Endpoint()); err != nil {
		return err
	}
	if err := r.Listen(); err != nil {
		return err
	}
	relayCtx, stopRelay := context.WithCancel(context.Background())
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Serve(relayCtx) }()
	defer func() { stopRelay(); <-relayDone }()

	fmt.Fprintf(stdout, "relay dev: relay on %s, admin on http://%s, Cloudly stand-in on %s, %d nodes; not yet: %s\n",
		r.DownstreamAddr(), r.AdminAddr(), cloudly.URL(), *nodes, strings.Join(sim.NotYet, ", "))
	for deadline := time.Now().Add(30 * time.Second); !r.Upstream().Attached(); time.Sleep(20 * time.Millisecond) {
		if ctx.Err() != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the relay did not attach to the Cloudly stand-in within 30 s")
		}
	}

	scDone := make(chan error, 1)
	go func() { scDone <- sc.Run(ctx, "ws://"+r.DownstreamAddr().String()+"/") }()
	status := time.NewTicker(time.Second)
	defer status.Stop()
	start := time.Now()
	for {
		select {
		case err := <-scDone:
			if err != nil && ctx.Err() == nil {
				return err
			}
			fmt.Fprintln(stdout, sc.Snapshot().Summary())
			return nil
		case <-status.C:
			fmt.Fprintf(stdout, "[%4.0fs] %s attached=%v\n", time.Since(start).Seconds(), sc.Snapshot().Summary(), cloudly.Attached())
		}
	}
}
