package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/testenv/relaytest"
	"code.foss.global/serve.zone/relay/internal/testenv/sim"
	"code.foss.global/serve.zone/relay/relay"
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
	e := relaytest.Start(t, relaytest.Options{Build: build, Quiet: true,
		Cloudly: func(c *sim.Cloudly) {
			c.SetCorestores([]contracts.CorestoreOrigin{{NodeID: "node-7", Origin: cs.Origin()}})
		},
		Configure: func(cfg *relay.Config) {
			cfg.CorestoreCAFile = filepath.Join(t.TempDir(), "corestore-ca.pem")
			os.WriteFile(cfg.CorestoreCAFile, cs.CertificatePEM(), 0o600)
		},
	})
	cloudly := e.Cloudly

	p := &sim.RestorePlan{RestoreID: "restore-build", NodeID: "node-7", NodeName: "node-7.example", Mappings: []string{"a->b"},
		Objects: []sim.RestoreObject{{Key: "one", Data: bytes.Repeat([]byte("1"), 600<<10)}, {Key: "two", Data: []byte("2")}}}
	var run sim.RestoreRun
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Until the configuration push has been applied the node is not carried.
		rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
		run, err = sim.RunIsolatedRestore(rctx, cloudly.Call, auth, p)
		rcancel()
		if err == nil || time.Now().After(deadline) || !(strings.Contains(err.Error(), "restore-node-not-carried") || strings.Contains(err.Error(), "no relay socket")) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
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
