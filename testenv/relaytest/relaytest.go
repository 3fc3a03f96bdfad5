// Package relaytest runs a real relay against the simulated Cloudly on loopback, the way
// cmd/relay builds one, for tests in any package: the fault suite, the relay's own tests, feature
// tests (their feature built on the relay's logger and metrics registry by Options.Build) and
// cmd/relay's tests of build(). Nothing here mocks the relay.
package relaytest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// Env is one relay under test with its simulated Cloudly.
type Env struct {
	T        testing.TB
	Cloudly  *sim.Cloudly
	Relay    *relay.Relay
	Config   relay.Config
	Log      zerolog.Logger       // what Cloudly and the relay log to; give it to peers whose lines count
	Logs     *Buffer              // every line Log writes, at debug level unless Options.LogLevel says
	Registry *prometheus.Registry // the relay's metrics registry (relay.Options.Registry)
	URL      string               // the relay's downstream ws:// URL

	stopOnce  sync.Once
	closeOnce sync.Once
	stop      func()
}

// Options adjust Start.
type Options struct {
	Features     relay.Features
	PingInterval time.Duration // zero: the relay's default (15 s)
	DeadTimeout  time.Duration // zero: the relay's default (45 s)
	CallTimeout  time.Duration // zero: the relay's default (60 s)
	// Bounds on unregistered downstream connections; zero: the relay's defaults.
	MaxUnregistered  int
	RegisterDeadline time.Duration
	MaxConnections   int // zero: the relay's default (RLIMIT_NOFILE less its reserve)
	// RegisteredShare is what one registered peer may hold; zero: relay.RegisteredShare (32 MiB).
	RegisteredShare int64
	Configure       func(*relay.Config)
	Quiet           bool               // log nothing (benchmarks): debug logging costs per request
	Cloudly         func(*sim.Cloudly) // runs before the relay dials
	// LogLevel is the level of Env.Log; zero is debug.
	LogLevel zerolog.Level
	// Logs collects the log lines; nil: a new Buffer. Pass one to share it with peers started
	// before the relay.
	Logs *Buffer
	// Build builds the relay in place of relay.New(cfg, Features, opts) (Features is then unused),
	// with cmd/relay's build() signature: from the completed Config and relay.Options whose Logger
	// is Env.Log and Registry Env.Registry. Features that need the relay's logger or metrics
	// registry are made here.
	Build func(cfg relay.Config, opts relay.Options) (*relay.Relay, error)
	// VPNHub is the hub endpoint the relay reports with registerClusterVpnHub (relay.Options.VPNHub);
	// nil: the hub is off. No hub is bound: the report is all a relay does with it.
	VPNHub *contracts.VPNHubEndpoint
	// Now is the relay's clock (relay.Options.Now); nil: time.Now.
	Now func() time.Time

	// AnonymousRegistrationBytes is the anonymous registrations' pool
	// (relay.Options.AnonymousRegistrationBytes); zero: relay.AnonymousRegistrationBytes (16 MiB).
	AnonymousRegistrationBytes int64
}

// Start runs a relay against a fresh Cloudly stand-in and waits until it is attached. It stops
// both when the test ends.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	e := &Env{T: t, Logs: o.Logs, Registry: relay.NewRegistry()}
	if e.Logs == nil {
		e.Logs = &Buffer{}
	}
	// A failure, flaky ones in CI above all, comes with what the relay and its peers said last.
	// Registered first, so it runs last: after the relay has stopped and logged its shutdown.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the last log lines of the relay and the simulated peers:\n%s", e.Logs.Tail(16<<10))
		}
	})
	e.Log = zerolog.New(e.Logs).Level(o.LogLevel)
	if o.Quiet {
		e.Log = zerolog.Nop()
	}
	c, err := sim.NewCloudly(e.Log)
	if err != nil {
		t.Fatal(err)
	}
	e.Cloudly = c
	if o.Cloudly != nil {
		o.Cloudly(c)
	}
	token := filepath.Join(t.TempDir(), "cloudly.jwt")
	if err := os.WriteFile(token, []byte(c.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.Config = relay.Config{
		ClusterID: c.ClusterID, NodeID: "relay-node", CloudlyURL: c.URL(), CloudlyTokenFile: token,
		Listen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: "127.0.0.1:0",
	}
	if o.Configure != nil {
		o.Configure(&e.Config)
	}
	if err := e.Config.Complete(); err != nil {
		t.Fatal(err)
	}
	build := o.Build
	if build == nil {
		build = func(cfg relay.Config, opts relay.Options) (*relay.Relay, error) {
			return relay.New(cfg, o.Features, opts)
		}
	}
	r, err := build(e.Config, relay.Options{Logger: e.Log, Registry: e.Registry, PingInterval: o.PingInterval, DeadTimeout: o.DeadTimeout, CallTimeout: o.CallTimeout,
		MaxUnregistered: o.MaxUnregistered, RegisterDeadline: o.RegisterDeadline, MaxConnections: o.MaxConnections, VPNHub: o.VPNHub,
		RegisteredShare: o.RegisteredShare, AnonymousRegistrationBytes: o.AnonymousRegistrationBytes, Now: o.Now})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Listen(); err != nil {
		t.Fatal(err)
	}
	e.Relay = r
	e.URL = "ws://" + r.DownstreamAddr().String() + "/"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx) }()
	e.stop = func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(relay.ShutdownTimeout + 2*time.Second):
			t.Error("relay did not shut down within its timeout")
		}
	}
	t.Cleanup(e.Close)
	e.WaitAttached()
	return e
}

// Shutdown stops the relay as SIGTERM would and waits for Serve to return.
func (e *Env) Shutdown() { e.stopOnce.Do(e.stop) }

// Close shuts the relay down and stops the Cloudly stand-in. It runs when the test ends; call it
// earlier to count what outlives them.
func (e *Env) Close() {
	e.Shutdown()
	e.closeOnce.Do(func() {
		e.Cloudly.Close()
		// The Cloudly stand-in judges the relay's order; whatever it refused fails the test.
		for _, v := range e.Cloudly.Violations() {
			e.T.Errorf("the relay broke Cloudly's order: %s", v)
		}
	})
}

// WaitAttached waits until the relay and Cloudly both see an accepted registration.
func (e *Env) WaitAttached() {
	e.T.Helper()
	e.Eventually("relay attached", func() bool { return e.Cloudly.Attached() && e.Relay.Upstream().Attached() })
}

// Eventually polls cond until it holds. It gives up after a minute: a bound for something that
// will never happen, not a claim about speed, which a busy machine could miss by many seconds.
func (e *Env) Eventually(what string, cond func() bool) {
	e.T.Helper()
	await.Until(e.T, what, time.Minute, cond)
}

// Dial connects a simulated node without registering it; it is closed when the test ends.
func (e *Env) Dial(id string) *sim.Node {
	e.T.Helper()
	n := sim.NewNode(id, zerolog.Nop())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Connect(ctx, e.URL); err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() {
		n.Close()
		for _, v := range n.Violations() {
			e.T.Errorf("the relay sent %s what no relay may send: %s", id, v)
		}
	})
	return n
}

// Node connects and registers a simulated node.
func (e *Env) Node(id string) *sim.Node {
	e.T.Helper()
	n := e.Dial(id)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.Register(ctx); err != nil {
		e.T.Fatalf("register %s: %v", id, err)
	}
	return n
}

// MetricSum is the sum of a counter's series in Env.Registry, whatever their labels.
func (e *Env) MetricSum(name string) float64 {
	e.T.Helper()
	families, err := e.Registry.Gather()
	if err != nil {
		e.T.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// Metric reads one counter or gauge sample from Env.Registry: the first series of name whose
// labels include the given name/value pairs; 0 when there is none.
func (e *Env) Metric(name string, labels ...string) float64 {
	e.T.Helper()
	families, err := e.Registry.Gather()
	if err != nil {
		e.T.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// Buffer collects log lines safely across goroutines.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Tail is at most the last n bytes written, from the start of a line.
func (s *Buffer) Tail(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.b.Bytes()
	if len(b) <= n {
		return string(b)
	}
	b = b[len(b)-n:]
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return string(b)
}
