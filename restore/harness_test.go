package restore_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/corestore"
	"code.foss.global/serve.zone/relay/internal/sim"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/restore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// authority is one grant authority for the whole test binary: RSA key generation is slow.
var authority = sync.OnceValue(func() *sim.RestoreAuthority {
	a, err := sim.NewRestoreAuthority()
	if err != nil {
		panic(err)
	}
	return a
})

// logBuffer collects every log line of a test, at debug level.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// harnessOptions shape a harness.
type harnessOptions struct {
	plaintext          bool          // the node Corestore speaks http:// (the relay runs --insecure-plaintext either way)
	timeout            time.Duration // the Corestore client's total timeout
	maxInflightPerNode int
	executeDelay       time.Duration
}

// harness is a relay built the way cmd/relay builds it — relay.Config completed, the corestore
// client wired into restore as its port, features sharing the relay's registry — attached to the
// sim Cloudly, whose configuration push names the sim Corestores:
//
//	node-a    the sim Corestore (node name node-a.cluster-sim), TLS verified by --corestore-ca-file
//	node-gone an origin nothing listens on
//	node-tls  a sim Corestore whose certificate the relay does not trust
type harness struct {
	t         *testing.T
	cloudly   *sim.Cloudly
	corestore *sim.Corestore
	untrusted *sim.Corestore
	relay     *relay.Relay
	restore   *restore.Restore
	client    *corestore.Client
	registry  *prometheus.Registry
	logs      *logBuffer
	gone      string // node-gone's origin
}

func newHarness(t *testing.T, o harnessOptions) *harness {
	t.Helper()
	h := &harness{t: t, logs: &logBuffer{}}
	// Registered first, so it runs last: after the relay and every peer have stopped logging.
	t.Cleanup(h.assertNoGrantLogged)
	log := zerolog.New(h.logs).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	var err error
	if h.cloudly, err = sim.NewCloudly(log); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.cloudly.Close)
	h.corestore = sim.NewCorestore(sim.CorestoreOptions{NodeName: "node-a.cluster-sim", Authority: authority().PublicKey(),
		Plaintext: o.plaintext, ExecuteDelay: o.executeDelay, Log: log})
	t.Cleanup(h.corestore.Close)
	h.untrusted = sim.NewCorestore(sim.CorestoreOptions{NodeName: "node-tls", Authority: authority().PublicKey(), Log: log})
	t.Cleanup(h.untrusted.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.gone = "https://" + ln.Addr().String()
	ln.Close()
	h.cloudly.SetCorestores([]contracts.CorestoreOrigin{
		{NodeID: "node-a", Origin: h.corestore.Origin()},
		{NodeID: "node-gone", Origin: h.gone},
		{NodeID: "node-tls", Origin: h.untrusted.Origin()},
	})

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "cloudly.jwt")
	os.WriteFile(tokenFile, []byte(h.cloudly.Token+"\n"), 0o600)
	cfg := relay.Config{
		ClusterID: h.cloudly.ClusterID, NodeID: "relay-node", CloudlyURL: h.cloudly.URL(), CloudlyTokenFile: tokenFile,
		Listen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: "127.0.0.1:0",
		LogLevel: "debug",
	}
	if !o.plaintext {
		cfg.CorestoreCAFile = filepath.Join(dir, "corestore-ca.pem")
		os.WriteFile(cfg.CorestoreCAFile, h.corestore.CertificatePEM(), 0o600)
	}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	// As cmd/relay's build(), with a shorter timeout and bound where a test asks for one.
	h.registry = relay.NewRegistry()
	h.client, err = corestore.New(corestore.Options{CAFile: cfg.CorestoreCAFile, AllowHTTP: cfg.InsecurePlaintext,
		Registerer: h.registry, Logger: log, Timeout: o.timeout})
	if err != nil {
		t.Fatal(err)
	}
	h.restore = restore.New(h.client, restore.Options{Registerer: h.registry, Logger: log, MaxInflightPerNode: o.maxInflightPerNode})
	h.relay, err = relay.New(cfg, relay.Features{Restore: h.restore}, log, relay.Options{Registry: h.registry})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.relay.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.relay.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
		h.restore.Close()
		h.client.Close()
	})
	deadline := time.Now().Add(10 * time.Second)
	for !h.cloudly.Attached() || !h.restore.Carried("node-a") {
		if time.Now().After(deadline) {
			t.Fatal("the relay did not attach and apply the configuration push")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return h
}

// call calls the relay as Cloudly.
func (h *harness) call(method string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return h.cloudly.Call(ctx, method, body)
}

// plan is a restore of two objects on node-a: 1.25 MiB (three chunks) and 700 KiB (two chunks).
func plan(id string) *sim.RestorePlan {
	a := bytes.Repeat([]byte("object-a "), 1310720/9+1)[:1310720]
	b := bytes.Repeat([]byte{0, 1, 2, 3, 4, 5, 6}, 716800/7+1)[:716800]
	return &sim.RestorePlan{RestoreID: id, NodeID: "node-a", NodeName: "node-a.cluster-sim",
		Objects:  []sim.RestoreObject{{Key: "db/base.tar", Data: a}, {Key: "db/wal.tar", Data: b}},
		Mappings: []string{"postgres:app->postgres:app-rehearsal", "s3:media->s3:media-rehearsal"}}
}

// metric is the value of the sample of name whose labels include labels (0 when none).
func (h *harness) metric(name string, labels map[string]string) float64 {
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
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
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
