package daemon

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/sim"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

func TestHubListenWithoutAnAddressIsAFlagError(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("jwt\n"), 0o600)
	base := []string{"run", "--cluster-id", "c1", "--node-id", "n1", "--cloudly-url", "ws://127.0.0.1:1/",
		"--cloudly-token-file", token, "--advertise-address", "192.0.2.10", "--insecure-plaintext",
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--hub-key-file", filepath.Join(dir, "hub.key")}
	for listen, want := range map[string]string{
		":4433":        "--hub-listen: must name the IPv4 address the hub binds",
		"0.0.0.0:4433": "--hub-listen: must name the IPv4 address the hub binds",
		"[::1]:4433":   "--hub-listen: must name the IPv4 address the hub binds",
		"127.0.0.1:0":  "--hub-listen: must be a unicast IPv4 address that is neither loopback nor link-local",
	} {
		code, _, stderr := runMain(t, nil, append(append([]string{}, base...), "--hub-listen", listen)...)
		if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, want) {
			t.Errorf("--hub-listen %s: exit %d, stderr %q", listen, code, stderr)
		}
	}
	os.WriteFile(filepath.Join(dir, "bad.key"), []byte("not a key\n"), 0o600)
	code, _, stderr := runMain(t, nil, append(append([]string{}, base...), "--hub-listen", "192.0.2.1:0",
		"--hub-key-file", filepath.Join(dir, "bad.key"))...)
	if code != 2 || !strings.Contains(stderr, "--hub-key-file:") || strings.Contains(stderr, "not a key") {
		t.Errorf("bad key file: exit %d, stderr %q", code, stderr)
	}
	// The key file is never read through a symbolic link.
	os.Symlink(filepath.Join(dir, "hub.key"), filepath.Join(dir, "link.key"))
	code, _, stderr = runMain(t, nil, append(append([]string{}, base...), "--hub-listen", "192.0.2.1:0",
		"--hub-key-file", filepath.Join(dir, "link.key"))...)
	if code != 2 || !strings.Contains(stderr, "--hub-key-file:") || !strings.Contains(stderr, "symbolic link") {
		t.Errorf("symlinked key file: exit %d, stderr %q", code, stderr)
	}
}

// A hub key file that group or world may read is loaded (nodes' credentials
// name its key) and the relay warns, as component vpnhub.
func TestHubKeyFileOpenToOthersIsWarnedAbout(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "hub.key")
	if _, err := vpnkey.WriteNewFile(path); err != nil {
		t.Fatal(err)
	}
	os.Chmod(path, 0o644)
	var logs bytes.Buffer
	cfg := Config{Config: relay.Config{HubListen: "127.0.0.1:0"}, HubKeyFile: path}
	hub, err := buildHub(cfg, zerolog.New(&logs), nil, netip.MustParseAddr("192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	hub.Close()
	line := logs.String()
	if !strings.Contains(line, `"level":"warn"`) || !strings.Contains(line, `"component":"vpnhub"`) || !strings.Contains(line, path) {
		t.Fatalf("no warning about a key file of mode 0644: %s", line)
	}
}

// TestRelayServesTheVPNHub runs the whole relay with its hub against the Cloudly stand-in: the
// registration is accepted, the hub is reported in its own call (registerClusterVpnHub) with the
// bound port and the key file's public key, Cloudly's membership push reaches the hub, and two
// simulated members, dialling the hub as Cloudly learned it, exchange packets through it, counted
// on /metrics.
func TestRelayServesTheVPNHub(t *testing.T) {
	log := zerolog.Nop()
	cloudly, err := sim.NewCloudly(log)
	if err != nil {
		t.Fatal(err)
	}
	defer cloudly.Close()
	dir := t.TempDir()
	token := filepath.Join(dir, "cloudly.jwt")
	os.WriteFile(token, []byte(cloudly.Token+"\n"), 0o600)
	cfg := Config{Config: relay.Config{ClusterID: cloudly.ClusterID, NodeID: "relay-node", CloudlyURL: cloudly.URL(), CloudlyTokenFile: token,
		Listen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: "127.0.0.1:0",
		HubListen: "127.0.0.1:0"}, HubKeyFile: filepath.Join(dir, "hub.key")}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	r, hub, err := BuildParts(cfg, relay.Options{Logger: log}, netip.MustParseAddr("192.0.2.1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(cfg.HubKeyFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("hub key file %v %v", st, err)
	}
	if err := r.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- r.Serve(ctx) }()
	defer func() { cancel(); <-served }()
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	reported, err := cloudly.WaitVPNHub(wctx)
	if err != nil {
		t.Fatal(err)
	}
	at, key, err := sim.HubTarget(reported)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := vpnkey.LoadFile(cfg.HubKeyFile, zerolog.Nop()); reported.Hub.ClusterID != cfg.ClusterID ||
		at != netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), hub.Addr().Port()) || key != want.Public {
		t.Fatalf("Cloudly learned the hub %+v at %s, want cluster %s at 192.0.2.1:%d with the key file's public key",
			reported.Hub, at, cfg.ClusterID, hub.Addr().Port())
	}

	nodes, err := sim.NewVPNNodes(sim.SimVPNControlPrefix, log, "node-a", "node-b")
	if err != nil {
		t.Fatal(err)
	}
	body := sim.VPNMembershipBody(sim.SimVPNAuthority, sim.SimVPNControlPrefix, 1, time.Now().Add(time.Hour).UnixMilli(), nodes)
	ans, err := cloudly.Call(wctx, contracts.MethodPushClusterVpnMembership, body)
	if g, ok := contracts.ReadVPNMembershipApplied(ans); err != nil || !ok || g != 1 {
		t.Fatalf("membership push: %s %v", ans, err)
	}
	for _, n := range nodes {
		// The dev hub binds loopback and reports 192.0.2.1: dial where it is, at the reported port.
		if err := n.Join(wctx, netip.AddrPortFrom(hub.Addr().Addr(), at.Port()), key, sim.SimVPNAuthority); err != nil {
			t.Fatalf("%s join: %v", n.ID, err)
		}
		defer n.Close()
	}
	if sent, err := nodes[0].Send(nodes[1], 10, 300); sent != 10 || err != nil {
		t.Fatalf("sent %d: %v", sent, err)
	}
	await.Within(10*time.Second, func() bool { return nodes[1].Received() >= 10 })
	if got := nodes[1].Received(); got != 10 {
		t.Fatalf("node-b received %d of 10", got)
	}
	resp, err := http.Get("http://" + r.AdminAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"relay_vpnhub_forwarded_packets_total 10", "relay_vpnhub_members 2", "relay_vpnhub_sessions 2"} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestHubAdvertiseAddress: behind a Service, each replica's hub binds its own address and reports
// the Service's (--hub-advertise-address); without --hub-listen the flag is refused by name.
func TestHubAdvertiseAddress(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Config: relay.Config{HubListen: "127.0.0.1:0", HubAdvertiseAddress: "192.0.2.53"}, HubKeyFile: filepath.Join(dir, "hub.key")}
	hub, err := buildHub(cfg, zerolog.Nop(), nil, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	defer hub.Close()
	if got := hub.Endpoint().Address; got != "192.0.2.53" {
		t.Fatalf("the hub reports %s, want the advertised 192.0.2.53", got)
	}
	token := filepath.Join(dir, "jwt")
	os.WriteFile(token, []byte("jwt"), 0o600)
	bad := relay.Config{ClusterID: "cluster-a", NodeID: "relay-node", CloudlyURL: "ws://127.0.0.1:1/", CloudlyTokenFile: token,
		AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, HubAdvertiseAddress: "192.0.2.53"}
	var ce *relay.ConfigError
	if err := bad.Complete(); !errors.As(err, &ce) || ce.Flag != "hub-advertise-address" {
		t.Fatalf("--hub-advertise-address without --hub-listen: %v", err)
	}
}
