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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/daemon"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// cmdDev runs the relay with simulated peers on loopback and prints what they observe: a status
// line every second, each turn of the outage cycle as it happens, and the summary line last.
func cmdDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("relay-dev", flag.ContinueOnError)
	nodes := fs.Int("nodes", 20, "simulated nodes")
	duration := fs.Duration("duration", 0, "stop after this long (0: until Ctrl-C)")
	logLevel := fs.String("log-level", "warn", "relay log level")
	replicas := fs.Int("replicas", 1, "relays, one elected through a Lease on a test Kubernetes API server (more than 1: needs its cached binaries)")
	at := defaultDevAddrs
	fs.StringVar(&at.listen, "listen", at.listen, "the relay's downstream listen address (port 0: a new one each run)")
	fs.StringVar(&at.admin, "admin-listen", at.admin, "the admin listener: the status page and /metrics")
	fs.StringVar(&at.hub, "hub-listen", at.hub, "the VPN hub's UDP address")
	if err := daemon.Parse(fs, args); err != nil {
		return err
	}
	if *nodes < 1 || *nodes > 100_000 {
		return daemon.Usagef("--nodes: must be from 1 to 100000")
	}
	if *duration < 0 {
		return daemon.Usagef("--duration: must not be negative (0: until Ctrl-C)")
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	if *replicas != 1 {
		return cmdDevHA(ctx, *replicas, *nodes, daemon.NewLogger(*logLevel, "console", stderr), *logLevel, stdout)
	}
	// Lines logged while the scenario holds Cloudly away carry script=outage: the session lost,
	// the failed dials and their 503s are the script, not a fault.
	var script scriptMark
	log := daemon.NewLogger(*logLevel, "console", stderr).Hook(&script)
	d, err := startDev(*nodes, log, *logLevel, at)
	if err != nil {
		return err
	}
	defer d.close()
	script.cloudly.Store(d.cloudly)

	start := time.Now()
	var mu sync.Mutex // one line at a time on stdout
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(stdout, "[%4.0fs] "+format+"\n", append([]any{time.Since(start).Seconds()}, args...)...)
	}
	d.sc.Story = func(line string) { say("%s", line) }
	admin := d.relay.AdminAddr()
	fmt.Fprintf(stdout, "relay-dev: %d simulated nodes through a relay on %s; status page http://%s/status, metrics http://%s/metrics; Cloudly stand-in on %s\n",
		*nodes, d.relay.DownstreamAddr(), admin, admin, d.cloudly.URL())
	t := d.sc.Timing.WithDefaults()
	fmt.Fprintf(stdout, "relay-dev: traffic flows while the relay is attached; after %s, and %s after each recovery, "+
		"Cloudly goes away for %s: the relay detaches and releases escrowed DNS renewals, "+
		"re-attaches when Cloudly is back, and the nodes register again\n", t.FirstAttached, t.Attached, t.Outage)
	if err := d.waitAttached(ctx); err != nil || ctx.Err() != nil {
		return err
	}

	scDone := make(chan error, 1)
	go func() { scDone <- d.sc.Run(ctx, "ws://"+d.relay.DownstreamAddr().String()+"/") }()
	status := time.NewTicker(time.Second)
	defer status.Stop()
	for ended := ctx.Done(); ; {
		select {
		case err := <-scDone:
			if err != nil && ctx.Err() == nil {
				return err
			}
			mu.Lock()
			fmt.Fprintln(stdout, d.sc.Snapshot().Summary())
			mu.Unlock()
			return nil
		case <-ended:
			stop() // the scenario may wait for a recovery: a second Ctrl-C ends the process at once
			ended = nil
		case <-status.C:
			say("%s attached=%v", d.sc.Snapshot().Summary(), d.cloudly.Attached())
		}
	}
}

// dev is a relay wired as `relay run` wires it, with a Cloudly stand-in and the scenario's peers,
// all on loopback.
type dev struct {
	relay   *relay.Relay
	cloudly *sim.Cloudly
	sc      *sim.Scenario
	hubDial netip.Addr // where the dev hub is bound (loopback): what nodes dial, at the reported port
	close   func()     // stops the relay, then the peers; removes the temporary files
}

// startDev starts the relay and the Cloudly stand-in and prepares the scenario for nodes; the
// relay is serving, not necessarily attached yet, and the nodes do not know the hub yet
// (waitAttached).
func startDev(nodes int, log zerolog.Logger, logLevel string, at devAddrs) (_ *dev, err error) {
	var undo []func()
	d := &dev{close: func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	if d.cloudly, err = sim.NewCloudly(log); err != nil {
		return nil, err
	}
	undo = append(undo, d.cloudly.Close)
	dir, err := os.MkdirTemp("", "relay-dev-")
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { os.RemoveAll(dir) })
	tokenFile := filepath.Join(dir, "cloudly.jwt")
	if err := os.WriteFile(tokenFile, []byte(d.cloudly.Token+"\n"), 0o600); err != nil {
		return nil, err
	}
	if d.sc, err = sim.NewScenario(nodes, d.cloudly, log); err != nil {
		return nil, err
	}
	undo = append(undo, d.sc.Close)
	cfg := daemon.Config{Config: relay.Config{
		ClusterID: d.cloudly.ClusterID, NodeID: "relay-node", CloudlyURL: d.cloudly.URL(), CloudlyTokenFile: tokenFile,
		Listen: at.listen, AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: at.admin, BuildVersion: relay.DefaultBuildVersion,
	}, LogLevel: logLevel, LogFormat: "console"}
	cfg.HubListen, cfg.HubKeyFile = at.hub, filepath.Join(dir, "hub.key")
	if err := cfg.Complete(); err != nil {
		return nil, err
	}
	// The hub binds loopback; the registration reports the advertise address, which Cloudly accepts.
	r, hub, err := daemon.BuildParts(cfg, relay.Options{Logger: log}, netip.MustParseAddr(cfg.AdvertiseAddress), nil)
	if err != nil {
		return nil, err
	}
	d.relay = r
	d.hubDial = hub.Addr().Addr()
	if err := r.Listen(); err != nil {
		return nil, err
	}
	relayCtx, stopRelay := context.WithCancel(context.Background())
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Serve(relayCtx) }()
	undo = append(undo, func() { stopRelay(); <-relayDone })
	return d, nil
}

// waitAttached waits up to 30 s for the relay to attach to the Cloudly stand-in and report its VPN
// hub there; nil also when ctx ends first. The nodes then dial the hub as Cloudly learned it from
// registerClusterVpnHub — its port and key — on the loopback address the dev hub binds (it reports
// the advertise address instead, which IRuntimeNetworkVpnHub accepts). So the scenario's VPN
// traffic flows only when the report does.
func (d *dev) waitAttached(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The relay sends the report once Cloudly accepted its registration: reported is attached.
	hub, err := d.cloudly.WaitVPNHub(wctx)
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("the relay did not attach to the Cloudly stand-in and report its VPN hub within 30 s: %w", err)
	}
	at, key, err := sim.HubTarget(hub)
	if err != nil {
		return err
	}
	d.sc.HubAddr, d.sc.HubKey = netip.AddrPortFrom(d.hubDial, at.Port()), key
	return nil
}

// devAddrs are where `relay-dev` binds; port 0 is a new port each run.
type devAddrs struct{ listen, admin, hub string }

// defaultDevAddrs binds everything on loopback, on new ports.
var defaultDevAddrs = devAddrs{listen: "127.0.0.1:0", admin: "127.0.0.1:0", hub: "127.0.0.1:0"}

// scriptMark is the dev logger's hook: while the Cloudly stand-in is held away by the scenario,
// every line gets script=outage.
type scriptMark struct {
	cloudly atomic.Pointer[sim.Cloudly] // set once the stand-in exists
}

func (m *scriptMark) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	if c := m.cloudly.Load(); c != nil && !c.Available() {
		e.Str("script", "outage")
	}
}
