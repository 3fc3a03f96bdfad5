package daemon

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// TestBuildCarriesAWholeRestore runs a whole isolated restore through the relay exactly as build()
// wires it, with the node's Corestore trusted through --corestore-ca-file.
func TestBuildCarriesAWholeRestore(t *testing.T) {
	auth, err := sim.NewRestoreAuthority()
	if err != nil {
		t.Fatal(err)
	}
	cs := sim.NewCorestore(sim.CorestoreOptions{NodeName: "node-7.example", Authority: auth.PublicKey(), Log: zerolog.Nop()})
	t.Cleanup(cs.Close)
	ca := filepath.Join(t.TempDir(), "corestore-ca.pem")
	os.WriteFile(ca, cs.CertificatePEM(), 0o600)
	e := relaytest.Start(t, relaytest.Options{Quiet: true,
		Build: buildWith(Config{CorestoreCAFile: ca, RegistryCacheMaxBytes: defaultRegistryCacheMaxBytes}),
		Cloudly: func(c *sim.Cloudly) {
			c.SetCorestores([]contracts.CorestoreOrigin{{NodeID: "node-7", Origin: cs.Origin()}})
		},
	})
	cloudly := e.Cloudly

	p := &sim.RestorePlan{RestoreID: "restore-build", NodeID: "node-7", NodeName: "node-7.example", Mappings: []string{"a->b"},
		Objects: []sim.RestoreObject{{Key: "one", Data: bytes.Repeat([]byte("1"), 600<<10)}, {Key: "two", Data: []byte("2")}}}
	var run sim.RestoreRun
	// Until the configuration push has been applied the node is not carried.
	await.Within(10*time.Second, func() bool {
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		run, err = sim.RunIsolatedRestore(rctx, cloudly.Call, auth, p)
		rcancel()
		return err == nil || !(strings.Contains(err.Error(), "restore-node-not-carried") || strings.Contains(err.Error(), "no relay socket"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if run.Chunks != 3 || run.Final.Status != "cleaned" || run.Final.NodeID != "node-7" {
		t.Fatalf("run %+v", run)
	}
}

func TestBadCorestoreCAFileExits2(t *testing.T) {
	dir := t.TempDir()
	token, ca := filepath.Join(dir, "token"), filepath.Join(dir, "ca.pem")
	os.WriteFile(token, []byte("jwt"), 0o600)
	os.WriteFile(ca, []byte("not a certificate"), 0o600)
	args := []string{"run", "--cluster-id", "c1", "--node-id", "n1", "--cloudly-url", "ws://127.0.0.1:1/", "--cloudly-token-file", token,
		"--advertise-address", "192.0.2.10", "--insecure-plaintext", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}
	code, _, stderr := runMain(t, nil, append(args, "--corestore-ca-file", ca)...)
	if code != 2 || !strings.Contains(stderr, "--corestore-ca-file: "+ca+" holds no PEM certificate") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runMain(t, nil, append(args, "--corestore-ca-file", filepath.Join(dir, "missing"))...)
	if code != 2 || !strings.Contains(stderr, "--corestore-ca-file: cannot read") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

// TestShutdownAbandonsCorestoreCallsInFlight: restore.Restore.Close "abandons the calls in flight
// (each is answered restore-node-unreachable), refuses new ones, and waits until every call has
// been answered". A relay built by build() must run it when it shuts down, so that no Corestore
// call outlives the relay: once Serve has returned, the Corestore must have seen its request
// cancelled, not kept it open until the client's 30 s timeout.
func TestShutdownAbandonsCorestoreCallsInFlight(t *testing.T) {
	entered := make(chan struct{}, 1)
	cancelled := make(chan struct{})
	release := make(chan struct{})
	cs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // read to its end, so the server notices the client leaving
		entered <- struct{}{}
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-release:
		}
	}))
	t.Cleanup(cs.Close)
	t.Cleanup(func() { close(release) })

	e := relaytest.Start(t, relaytest.Options{Build: build, Quiet: true,
		Cloudly: func(c *sim.Cloudly) {
			c.SetCorestores([]contracts.CorestoreOrigin{{NodeID: "node-7", Origin: cs.URL}})
		},
	})
	body := []byte(`{"nodeId":"node-7","control":{"grant":"g","expectedRevision":0}}`)
	go func() {
		await.Within(5*time.Second, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			_, err := e.Cloudly.Call(ctx, contracts.MethodPrepareIsolatedRestoreOnNode, body)
			cancel()
			return err == nil || !strings.Contains(err.Error(), "restore-node-not-carried")
		})
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the Corestore call never arrived")
	}
	e.Shutdown() // Serve has returned: the relay is down
	select {
	case <-cancelled:
	case <-time.After(2 * time.Second):
		t.Fatal("the relay shut down but its Corestore call is still in flight: restore.Close was never run")
	}
}
