package restore_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/corestore"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/restore"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// authority is one grant authority for the whole test binary: RSA key generation is slow.
var authority = sync.OnceValue(func() *sim.RestoreAuthority {
	a, err := sim.NewRestoreAuthority()
	if err != nil {
		panic(err)
	}
	a.RecordGrants = true // assertNoGrantLogged looks for every grant in the logs
	return a
})

// harnessOptions shape a harness.
type harnessOptions struct {
	plaintext          bool          // the node Corestore speaks http:// (the relay runs --insecure-plaintext either way)
	timeout            time.Duration // the Corestore client's total timeout
	maxInflightPerNode int
	executeDelay       time.Duration
}

// harness is a relay built the way cmd/relay builds it (testenv/relaytest) — the corestore
// client wired into restore as its port, features sharing the relay's registry — attached to the
// sim Cloudly, whose configuration push names the sim Corestores:
//
//	node-a    the sim Corestore (node name node-a.cluster-sim), TLS verified by --corestore-ca-file
//	node-gone an origin nothing listens on
//	node-tls  a sim Corestore whose certificate the relay does not trust
type harness struct {
	*relaytest.Env
	corestore *sim.Corestore
	untrusted *sim.Corestore
	restore   *restore.Restore
	client    *corestore.Client
	gone      string // node-gone's origin
}

func newHarness(t *testing.T, o harnessOptions) *harness {
	t.Helper()
	h := &harness{}
	logs := &relaytest.Buffer{}
	// Registered first, so it runs last: after the relay and every peer have stopped logging.
	t.Cleanup(func() {
		if h.Env != nil {
			h.assertNoGrantLogged()
		}
	})
	log := zerolog.New(logs).Level(zerolog.DebugLevel)
	h.corestore = sim.NewCorestore(sim.CorestoreOptions{NodeName: "node-a.cluster-sim", Authority: authority().PublicKey(),
		Plaintext: o.plaintext, ExecuteDelay: o.executeDelay, Log: log, RecordControls: true})
	t.Cleanup(h.corestore.Close)
	h.untrusted = sim.NewCorestore(sim.CorestoreOptions{NodeName: "node-tls", Authority: authority().PublicKey(), Log: log})
	t.Cleanup(h.untrusted.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.gone = "https://" + ln.Addr().String()
	ln.Close()

	h.Env = relaytest.Start(t, relaytest.Options{
		Logs: logs,
		Cloudly: func(c *sim.Cloudly) {
			c.SetCorestores([]contracts.CorestoreOrigin{
				{NodeID: "node-a", Origin: h.corestore.Origin()},
				{NodeID: "node-gone", Origin: h.gone},
				{NodeID: "node-tls", Origin: h.untrusted.Origin()},
			})
		},
		// As cmd/relay's build(), with a shorter timeout and bound where a test asks for one, and
		// the node's Corestore trusted as cmd/relay trusts --corestore-ca-file: one pool.
		Build: func(cfg relay.Config, ro relay.Options) (*relay.Relay, error) {
			log := ro.Logger
			var roots *x509.CertPool
			if !o.plaintext {
				roots = x509.NewCertPool()
				roots.AppendCertsFromPEM(h.corestore.CertificatePEM())
			}
			var err error
			h.client, err = corestore.New(corestore.Options{Logger: log, Registerer: ro.Registry, RootCAs: roots,
				AllowHTTP: cfg.InsecurePlaintext, Timeout: o.timeout})
			if err != nil {
				return nil, err
			}
			// Cleanups run last first: these after relaytest has stopped the relay, restore then client.
			t.Cleanup(h.client.Close)
			h.restore, err = restore.New(h.client, restore.Options{Logger: log, Registerer: ro.Registry, MaxInflightPerNode: o.maxInflightPerNode})
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { h.restore.Close() })
			return relay.New(cfg, relay.Features{Parts: []relay.Part{{Name: "restore", Impl: h.restore}}}, ro)
		},
	})
	h.Eventually("the relay applies the configuration push", func() bool { return h.restore.Carried("node-a") })
	return h
}

// call calls the relay as Cloudly.
func (h *harness) call(method string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return h.Cloudly.Call(ctx, method, body)
}

// plan is a restore of two objects on node-a: 1.25 MiB (three chunks) and 700 KiB (two chunks).
func plan(id string) *sim.RestorePlan {
	a := bytes.Repeat([]byte("object-a "), 1310720/9+1)[:1310720]
	b := bytes.Repeat([]byte{0, 1, 2, 3, 4, 5, 6}, 716800/7+1)[:716800]
	return &sim.RestorePlan{RestoreID: id, NodeID: "node-a", NodeName: "node-a.cluster-sim",
		Objects:  []sim.RestoreObject{{Key: "db/base.tar", Data: a}, {Key: "db/wal.tar", Data: b}},
		Mappings: []string{"postgres:app->postgres:app-rehearsal", "s3:media->s3:media-rehearsal"}}
}
