package platform_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/utils/clock"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/corestore"
	"code.foss.global/serve.zone/relay/platform"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Secrets the harness hands out; no log line, status page or metric may show one.
const (
	credentialA = "corestore-credential-node-a-0123456789abcdef"
	credentialB = "corestore-credential-node-b-fedcba9876543210"
)

// harnessOptions shape a harness.
type harnessOptions struct {
	platform platform.Options // ListInterval, StateInterval, … (Logger and Registerer are the relay's)
	stall    time.Duration    // the Corestore client's stall bound (0: its default)
	// stallClock is the clock the Corestore client's stall bound runs on (nil: the wall clock).
	// A fake one, its own, moves only when the test moves it: a healthy closure never meets the
	// bound, and a stalled one meets it once the test passes it.
	stallClock clock.WithDelayedExecution
	noOrigins  bool // the configuration push names no Corestore
	more       int  // Corestores besides node-a and node-b: node-s1 … node-sN
	// receiveBuffer is node-a's and node-b's Corestores' socket receive buffer (0: the
	// system's): a small one holds the relay's writes back soon once a Corestore stops reading.
	receiveBuffer int
}

// harness is a relay built as cmd/relay builds it — the corestore client as the agent's port —
// attached to the sim Cloudly, whose configuration push names two sim Corestores (plain HTTP, as
// with --insecure-plaintext): node-a and node-b, each accepting only its own credential.
type harness struct {
	*relaytest.Env
	a, b     *sim.Corestore
	more     []*sim.Corestore // node-s1 … node-sN, each accepting only its own credential
	platform *platform.Platform
}

func newHarness(t *testing.T, o harnessOptions) *harness {
	t.Helper()
	h := &harness{}
	logs := &relaytest.Buffer{}
	t.Cleanup(func() {
		if h.Env != nil {
			h.assertNoSecretShown()
		}
	})
	h.a = sim.NewCorestore(sim.CorestoreOptions{NodeName: "node-a", Plaintext: true, ReceiveBuffer: o.receiveBuffer})
	t.Cleanup(h.a.Close)
	h.b = sim.NewCorestore(sim.CorestoreOptions{NodeName: "node-b", Plaintext: true, ReceiveBuffer: o.receiveBuffer})
	t.Cleanup(h.b.Close)
	h.a.Platform().SetBearer(credentialA)
	h.b.Platform().SetBearer(credentialB)
	origins := []contracts.CorestoreOrigin{{NodeID: "node-a", Origin: h.a.Origin()}, {NodeID: "node-b", Origin: h.b.Origin()}}
	for i := 1; i <= o.more; i++ {
		id := fmt.Sprintf("node-s%d", i)
		c := sim.NewCorestore(sim.CorestoreOptions{NodeName: id, Plaintext: true})
		t.Cleanup(c.Close)
		c.Platform().SetBearer(moreCredential(id))
		h.more = append(h.more, c)
		origins = append(origins, contracts.CorestoreOrigin{NodeID: id, Origin: c.Origin()})
	}
	h.Env = relaytest.Start(t, relaytest.Options{
		Logs: logs,
		Cloudly: func(c *sim.Cloudly) {
			if !o.noOrigins {
				c.SetCorestores(origins)
			}
			c.Platform().SetCredential("node-a", credentialA)
			c.Platform().SetCredential("node-b", credentialB)
			for _, o := range origins[2:] {
				c.Platform().SetCredential(o.NodeID, moreCredential(o.NodeID))
			}
			c.Platform().SetDesiredState(json.RawMessage(desired))
		},
		Build: func(cfg relay.Config, ro relay.Options) (*relay.Relay, error) {
			cs, err := corestore.New(corestore.Options{Logger: ro.Logger, Registerer: ro.Registry, AllowHTTP: cfg.InsecurePlaintext, StallTimeout: o.stall, Clock: o.stallClock})
			if err != nil {
				return nil, err
			}
			t.Cleanup(cs.Close)
			po := o.platform
			po.Logger, po.Registerer = ro.Logger, ro.Registry
			if h.platform, err = platform.New(cs, po); err != nil {
				return nil, err
			}
			t.Cleanup(func() { h.platform.Close() })
			return relay.New(cfg, relay.Features{Parts: []relay.Part{{Name: "platform", Impl: h.platform}}}, ro)
		},
	})
	return h
}

// moreCredential is the credential of one of the harness's further Corestores.
func moreCredential(id string) string { return "corestore-credential-" + id + "-0123456789abcdef" }

// desired is Cloudly's desired state: two bindings for node-a, one for node-b, one for a node
// without a Corestore; inner members in shapes the relay must not touch.
const desired = `{"capabilities":{"corestore-inventory":true,"big":123456789012345678901234567890},` +
	`"providerConfigs":[{"provider":"s3","secretRef":"sr-1","ratio":1.50}],"bindings":[` +
	`{"nodeId":"node-a","binding":{"serviceId":"svc-1","dbname":"app-db-marker","x":1e2}},` +
	`{"nodeId":"node-b","binding":{"serviceId":"svc-2","dbname":"other"}},` +
	`{"nodeId":"node-z","binding":{"serviceId":"svc-9"}},` +
	`{"nodeId":"node-a","binding":"second"}]}`

// status is the agent's status as /status.json would show it.
func (h *harness) status() platform.Status { return h.platform.Status().(platform.Status) }

func (h *harness) node(id string) platform.StatusNode {
	for _, n := range h.status().Nodes {
		if n.Node == id {
			return n
		}
	}
	return platform.StatusNode{}
}

// waitFor polls cond until it holds. It gives up only near the test binary's deadline: a guard
// against a hang, never a time the behaviour must meet (a busy machine may be slow).
func (h *harness) waitFor(what string, cond func() bool) {
	h.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard(h.T))
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			h.T.Fatalf("never happened: %s", what)
		case <-tick.C:
		}
	}
}

// await waits for ch to be closed, with waitFor's guard.
func (h *harness) await(ch <-chan struct{}, what string) {
	h.T.Helper()
	select {
	case <-ch:
	case <-time.After(guard(h.T)):
		h.T.Fatalf("never happened: %s", what)
	}
}

// guard is how long a wait may last before the test gives up: until shortly before the test
// binary's deadline, or ten minutes without one.
func guard(t testing.TB) time.Duration {
	dl, ok := t.(interface{ Deadline() (time.Time, bool) })
	if !ok {
		return 10 * time.Minute
	}
	if d, ok := dl.Deadline(); ok {
		return max(time.Until(d)-15*time.Second, time.Second)
	}
	return 10 * time.Minute
}

// assertNoSecretShown: no credential, no enrollment secret, no descriptor, no binding reaches a
// log line, the status page or a metric.
func (h *harness) assertNoSecretShown() {
	h.T.Helper()
	logs := h.Logs.String()
	st, _ := json.Marshal(h.platform.Status())
	metrics := h.metricsText()
	for _, s := range []string{credentialA, credentialB, "secretRef", "sr-1", "svc-1", "app-db-marker", h.a.Origin(), h.b.Origin()} {
		if strings.Contains(logs, s) && s != h.a.Origin() && s != h.b.Origin() {
			h.T.Errorf("a log line shows %.16s…", s)
		}
		if strings.Contains(string(st), s) {
			h.T.Errorf("the status shows %.16s…", s)
		}
		if strings.Contains(metrics, s) {
			h.T.Errorf("a metric shows %.16s…", s)
		}
	}
}

func (h *harness) metricsText() string {
	mfs, err := h.Registry.Gather()
	if err != nil {
		h.T.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		b.WriteString(mf.String())
	}
	return b.String()
}
