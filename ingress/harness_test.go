package ingress_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"code.foss.global/serve.zone/relay/ingress"
	"code.foss.global/serve.zone/relay/internal/sim"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
)

// Every test here runs real peers — the sim Cloudly, sim nodes and sim ingresses — through a real
// relay on loopback, built the way cmd/relay builds it. No goroutine may outlive them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer collects every log line of a test, to check what never appears in them.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type harness struct {
	t        testing.TB
	log      zerolog.Logger
	logs     *syncBuffer
	cloudly  *sim.Cloudly
	control  *sim.IngressControl
	server   *ingress.Server
	relay    *relay.Relay
	registry *prometheus.Registry
	url      string
}

type harnessOptions struct {
	statisticsTimeout time.Duration
	logLevel          zerolog.Level
}

// newHarness starts a sim Cloudly with Cloudly's ingress handlers and a relay with the ingress
// feature (relay.Config with InsecurePlaintext, loopback listeners, a token file, as `relay dev`),
// and waits until the relay is attached. Everything stops at the end of the test.
func newHarness(t testing.TB, opts harnessOptions) *harness {
	t.Helper()
	logs := &syncBuffer{}
	log := zerolog.New(logs).Level(opts.logLevel)
	cloudly, err := sim.NewCloudly(log)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, log: log, logs: logs, cloudly: cloudly, control: sim.ServeIngress(cloudly), registry: relay.NewRegistry()}
	tokenFile := filepath.Join(t.TempDir(), "cloudly.jwt")
	if err := os.WriteFile(tokenFile, []byte(cloudly.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := relay.Config{
		ClusterID: cloudly.ClusterID, NodeID: "relay-node", CloudlyURL: cloudly.URL(), CloudlyTokenFile: tokenFile,
		Listen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: "127.0.0.1:0",
		LogLevel: "debug",
	}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	h.server, err = ingress.New(ingress.Config{Registry: h.registry, Log: log, StatisticsTimeout: opts.statisticsTimeout})
	if err != nil {
		t.Fatal(err)
	}
	h.relay, err = relay.New(cfg, relay.Features{Ingress: h.server}, log, relay.Options{Registry: h.registry})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.relay.Listen(); err != nil {
		t.Fatal(err)
	}
	h.url = "ws://" + h.relay.DownstreamAddr().String() + "/"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.relay.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
		cloudly.Close()
	})
	h.waitFor("the relay attaches", func() bool { return cloudly.Attached() && cloudly.Received("getClusterRouteTable") > 0 })
	return h
}

func (h *harness) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	h.t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds, failing the test after 10 s.
func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ingress connects an ingress for node with bearer; Cloudly designates it when designate is set.
func (h *harness) ingress(node, bearer string, designate bool) *sim.Ingress {
	h.t.Helper()
	if designate {
		h.control.Designate(node, bearer)
	}
	in := sim.NewIngress(node, bearer, h.log)
	if err := in.Connect(h.ctx(), h.url); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(in.Close)
	return in
}

// accepted connects, designates and registers an ingress, failing the test on a refusal.
func (h *harness) accepted(node, bearer string) *sim.Ingress {
	h.t.Helper()
	in := h.ingress(node, bearer, true)
	if _, err := in.Register(h.ctx()); err != nil {
		h.t.Fatalf("ingress %s registration refused: %v", node, err)
	}
	return in
}

// node connects and registers a Pallet node.
func (h *harness) node(id string) *sim.Node {
	h.t.Helper()
	n := sim.NewNode(id, h.log)
	if err := n.Connect(h.ctx(), h.url); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(n.Close)
	if _, err := n.Register(h.ctx()); err != nil {
		h.t.Fatalf("node %s registration refused: %v", id, err)
	}
	return n
}

// push pushes a table as Cloudly and returns the relay's answer.
func (h *harness) push(table string) string {
	h.t.Helper()
	resp, err := h.control.PushTable(h.ctx(), json.RawMessage(table))
	if err != nil {
		h.t.Fatalf("push: %v", err)
	}
	return string(resp)
}

// remote is the error a peer received, as it travelled.
func remote(t *testing.T, err error) *typedsocket.Error {
	t.Helper()
	var e *typedsocket.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a remote error", err, err)
	}
	return e
}

// metric reads one sample from the registry: name plus label pairs.
func (h *harness) metric(name string, labels ...string) float64 {
	h.t.Helper()
	families, err := h.registry.Gather()
	if err != nil {
		h.t.Fatal(err)
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
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	return 0
}
