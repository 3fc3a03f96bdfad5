package ingress_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"code.foss.global/serve.zone/relay/ingress"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// Every test here runs real peers — the sim Cloudly, sim nodes and sim ingresses — through a real
// relay on loopback, built the way cmd/relay builds it. No goroutine may outlive them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type harness struct {
	*relaytest.Env
	control *sim.IngressControl
	server  *ingress.Server
}

type harnessOptions struct {
	statisticsTimeout time.Duration
	logLevel          zerolog.Level
}

// newHarness starts a relay with the ingress feature (testenv/relaytest: a real relay attached to
// the sim Cloudly, as `relay-dev`) with Cloudly's ingress handlers, and waits until the relay has
// pulled the route table. Everything stops at the end of the test.
func newHarness(t testing.TB, opts harnessOptions) *harness {
	t.Helper()
	h := &harness{}
	h.Env = relaytest.Start(t, relaytest.Options{
		LogLevel: opts.logLevel,
		Cloudly:  func(c *sim.Cloudly) { h.control = sim.ServeIngress(c) },
		Build: func(cfg relay.Config, o relay.Options) (*relay.Relay, error) {
			log := o.Logger
			var err error
			h.server, err = ingress.New(ingress.Options{Logger: log, Registerer: o.Registry, StatisticsTimeout: opts.statisticsTimeout})
			if err != nil {
				return nil, err
			}
			return relay.New(cfg, relay.Features{Parts: []relay.Part{{Name: "ingress", Impl: h.server}}}, o)
		},
	})
	h.Eventually("the relay pulls the route table", func() bool { return h.Cloudly.Received("getClusterRouteTable") > 0 })
	return h
}

func (h *harness) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	h.T.Cleanup(cancel)
	return ctx
}

// ingress connects an ingress for node with bearer; Cloudly designates it when designate is set.
func (h *harness) ingress(node, bearer string, designate bool) *sim.Ingress {
	h.T.Helper()
	if designate {
		h.control.Designate(node, bearer)
	}
	in := sim.NewIngress(node, bearer, h.Log)
	if err := in.Connect(h.ctx(), h.URL); err != nil {
		h.T.Fatal(err)
	}
	h.T.Cleanup(in.Close)
	return in
}

// accepted connects, designates and registers an ingress, failing the test on a refusal.
func (h *harness) accepted(node, bearer string) *sim.Ingress {
	h.T.Helper()
	in := h.ingress(node, bearer, true)
	if _, err := in.Register(h.ctx()); err != nil {
		h.T.Fatalf("ingress %s registration refused: %v", node, err)
	}
	return in
}

// node connects and registers a Pallet node.
func (h *harness) node(id string) *sim.Node {
	h.T.Helper()
	n := sim.NewNode(id, h.Log)
	if err := n.Connect(h.ctx(), h.URL); err != nil {
		h.T.Fatal(err)
	}
	h.T.Cleanup(n.Close)
	if _, err := n.Register(h.ctx()); err != nil {
		h.T.Fatalf("node %s registration refused: %v", id, err)
	}
	return n
}

// push pushes a table as Cloudly and returns the relay's answer.
func (h *harness) push(table string) string {
	h.T.Helper()
	resp, err := h.control.PushTable(h.ctx(), json.RawMessage(table))
	if err != nil {
		h.T.Fatalf("push: %v", err)
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
