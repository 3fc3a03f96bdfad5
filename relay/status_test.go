package relay_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/escrow"
	"code.foss.global/serve.zone/relay/ingress"
	"code.foss.global/serve.zone/relay/platform"
	"code.foss.global/serve.zone/relay/registry"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/restore"
	"code.foss.global/serve.zone/relay/status"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
	"code.foss.global/serve.zone/relay/vpnhub"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// TestStatusPage: /status.json and /status show what the relay carries, the busiest nodes first,
// and never a secret.
func TestStatusPage(t *testing.T) {
	e := start(t, relay.Features{})
	quiet, busy := e.node("node-quiet"), e.node("node-busy")
	for i := range 5 {
		if _, err := busy.Report(ctx5(t), "reportRuntimeAssignmentObservation", map[string]any{"i": i}); err != nil {
			t.Fatal(err)
		}
	}
	quiet.Report(ctx5(t), "reportRuntimeAssignmentObservation", nil)

	code, body := e.admin("/status.json")
	if code != 200 {
		t.Fatalf("/status.json: %d", code)
	}
	var st status.Snapshot
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if !st.Cloudly.Attached || st.Cloudly.Since.IsZero() || st.Cloudly.Custody != "held" || st.Build.InterfacesVersion == "" {
		t.Fatalf("cloudly/build = %+v %+v", st.Cloudly, st.Build)
	}
	if st.Nodes.Count != 2 || len(st.Nodes.Busiest) != 2 || st.Nodes.Busiest[0].Node != "node-busy" ||
		st.Nodes.Busiest[0].RequestsToCloudly != 5 || st.Nodes.Busiest[1].RequestsToCloudly != 1 {
		t.Fatalf("nodes = %+v", st.Nodes)
	}

	code, page := e.admin("/status")
	if code != 200 || !strings.Contains(page, `id="attached">attached<`) || !strings.Contains(page, `<td id="nodes">2</td>`) ||
		!strings.Contains(page, "node-busy") {
		t.Fatalf("/status (%d) does not show the attached state and two nodes:\n%s", code, page)
	}
	for _, secret := range []string{"bearer-node-busy", "bearer-node-quiet", e.cloudly.Token} {
		if strings.Contains(body, secret) || strings.Contains(page, secret) {
			t.Fatalf("the status page shows a secret (%q)", secret)
		}
	}
}

// TestStatusPageSaysWhyDetached: detached because Cloudly refuses the registration, the page,
// status.json and /readyz name the refusal and the next retry, the outage is listed open with the
// loss that began it, and closed at the next attach; counters are listed with their rates, the
// groups at zero folded away, and no secret is shown.
func TestStatusPageSaysWhyDetached(t *testing.T) {
	e := start(t, relay.Features{})
	e.node("node-a").Report(ctx5(t), "reportRuntimeAssignmentObservation", nil)
	e.cloudly.SetRegistrationRefusal(contracts.RelayNodeForeign.Refuse("node relay-node is not in cluster-sim"))
	e.cloudly.Drop()
	var st status.Snapshot
	e.eventually("the refusal on status.json", func() bool {
		_, body := e.admin("/status.json")
		st = status.Snapshot{}
		return json.Unmarshal([]byte(body), &st) == nil && !st.Cloudly.Attached && st.Cloudly.LastFailure != nil &&
			st.Cloudly.LastFailure.Refusal == "relay-node-foreign" && st.Cloudly.NextRetry != nil
	})
	if f := st.Cloudly.LastFailure; f.Kind != "refused" || f.Step != "cluster relay registration" || f.At.IsZero() ||
		!strings.Contains(f.Message, "not in cluster-sim") || st.Cloudly.Attempts < 1 {
		t.Fatalf("last failure %+v, attempts %d", f, st.Cloudly.Attempts)
	}
	if !strings.HasPrefix(st.Cloudly.Reason, "registration refused relay-node-foreign: ") || !strings.HasPrefix(st.Ready, "detached: ") {
		t.Fatalf("reason %q, ready %q", st.Cloudly.Reason, st.Ready)
	}
	if n := len(st.Cloudly.Outages); n != 1 || st.Cloudly.Outages[0].End != nil || !strings.HasPrefix(st.Cloudly.Outages[0].Cause, "session lost: ") {
		t.Fatalf("outages = %+v", st.Cloudly.Outages)
	}
	if st.Role != "single" || st.UptimeSeconds < 0 || st.Started.IsZero() || st.Addresses.Listen != e.relay.DownstreamAddr().String() ||
		st.Addresses.Admin != e.relay.AdminAddr().String() || st.Addresses.Advertise != e.cfg.AdvertiseAddress {
		t.Fatalf("role %q, started %v, addresses %+v", st.Role, st.Started, st.Addresses)
	}
	code, body := e.admin("/readyz")
	if code != 503 || !strings.Contains(body, "detached: registration refused relay-node-foreign: ") ||
		!(strings.Contains(body, "next retry in ") || strings.Contains(body, "retrying now")) {
		t.Fatalf("/readyz = %d %q while refused", code, body)
	}
	code, page := e.admin("/status")
	reason := regexp.MustCompile(`id="detach-reason"[^>]*>([^<]*)<`).FindStringSubmatch(page)
	if code != 200 || reason == nil || !strings.Contains(reason[1], "registration refused relay-node-foreign") {
		t.Fatalf("/status (%d) does not say why it is detached: %v", code, reason)
	}
	for _, want := range []string{`<meta http-equiv="refresh" content="10">`, `id="outages"`, "ongoing", `id="role">single<`,
		`<details id="zero-counters">`, "relay_upstream_registrations_total", "outcome=relay-node-foreign"} {
		if !strings.Contains(page, want) {
			t.Errorf("/status does not show %q", want)
		}
	}

	e.cloudly.SetRegistrationRefusal(nil)
	e.waitAttached()
	_, body = e.admin("/status.json")
	st = status.Snapshot{}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Cloudly.Outages) != 1 || st.Cloudly.Outages[0].End == nil || st.Cloudly.Reason != "" || st.Ready != "ready" || st.Cloudly.Attempts != 0 {
		t.Fatalf("after attaching again: ready %q reason %q attempts %d outages %+v", st.Ready, st.Cloudly.Reason, st.Cloudly.Attempts, st.Cloudly.Outages)
	}
	var counted bool
	for _, g := range st.Counters {
		if g.Name == "relay_upstream_attaches_total" && len(g.Series) == 1 && g.Series[0].Total == 2 {
			counted = true
		}
	}
	if !counted {
		t.Fatalf("the counters do not show two attaches: %+v", st.Counters)
	}
	_, page = e.admin("/status")
	for _, secret := range []string{"bearer-node-a", e.cloudly.Token} {
		if strings.Contains(body, secret) || strings.Contains(page, secret) {
			t.Fatalf("the status page shows a secret (%.12s…)", secret)
		}
	}
}

// TestStatusPageHidesTheURLQuery: a Cloudly URL may carry a credential in its query; when the
// dial fails with an error that quotes the URL, the page and /readyz show the failure without it.
func TestStatusPageHidesTheURLQuery(t *testing.T) {
	const secret = "url-query-status-secret"
	x := relaytest.Start(t, relaytest.Options{Configure: func(c *relay.Config) { c.CloudlyURL += "?access=" + secret }})
	x.Cloudly.Close() // the next dial is refused at TCP: the error quotes the URL it dialled
	var st status.Snapshot
	x.Eventually("a dial failure", func() bool {
		_, body := statusGet(t, x, "/status.json")
		st = status.Snapshot{}
		return json.Unmarshal([]byte(body), &st) == nil && st.Cloudly.LastFailure != nil && st.Cloudly.LastFailure.Kind == "dial"
	})
	_, doc := statusGet(t, x, "/status.json")
	_, page := statusGet(t, x, "/status")
	_, ready := statusGet(t, x, "/readyz")
	if !strings.Contains(ready, "detached: dial failed: ") || !strings.Contains(page, "dial failed: ") {
		t.Fatalf("/readyz %q; the page does not show the dial failure", ready)
	}
	if msg := st.Cloudly.LastFailure.Message; !strings.Contains(msg, "?…") {
		t.Fatalf("the failure does not quote the URL with its query cut (the test proves nothing): %q", msg)
	}
	for what, text := range map[string]string{"/status.json": doc, "/status": page, "/readyz": ready} {
		if strings.Contains(text, secret) || strings.Contains(text, x.Cloudly.Token) {
			t.Errorf("%s shows the URL's query or the token", what)
		}
	}
}

// TestStatusPageListsTheBusiest100: a relay carrying more nodes lists only the busiest 100, so the
// page's cost does not grow with the cluster.
func TestStatusPageListsTheBusiest100(t *testing.T) {
	if testing.Short() {
		t.Skip("120 node connections")
	}
	e := start(t, relay.Features{})
	for i := range 120 {
		e.node(fmt.Sprintf("node-%03d", i))
	}
	_, body := e.admin("/status.json")
	var st status.Snapshot
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if st.Nodes.Count != 120 || len(st.Nodes.Busiest) != 100 {
		t.Fatalf("%d nodes, %d listed; want 120 and 100", st.Nodes.Count, len(st.Nodes.Busiest))
	}
	if _, page := e.admin("/status"); !strings.Contains(page, "the busiest 100 of 120") {
		t.Fatal("the page does not say it lists the busiest 100 of 120")
	}
}

// TestStatusPageShowsEveryPart: a relay with every feature on, each carrying something — an
// escrowed run, a registered ingress and a route table, a restore call waiting on its Corestore,
// a VPN member joined, a registry cache — shows each part's facts in /status.json and on /status,
// and none of the secrets the test used: bearers, the machine JWT, signatures, a grant, the
// route table's contents, a Corestore origin, VPN keys.
func TestStatusPageShowsEveryPart(t *testing.T) {
	const (
		ingressBearer = "bearer-ingress-status-secret"
		grant         = "grant-status-secret-0123456789"
		tableSecret   = "-----BEGIN PRIVATE KEY----- route-table-status-secret"
		origin        = "https://corestore-origin-status-secret.example"
		credential    = "corestore-credential-status-secret"
	)
	var (
		control *sim.IngressControl
		rs      *restore.Restore
		pf      *platform.Platform
		hub     *vpnhub.Hub
		hubKey  vpnkey.Pair
	)
	port := &waitingCorestore{release: make(chan struct{})}
	e := relaytest.Start(t, relaytest.Options{
		Cloudly: func(c *sim.Cloudly) {
			control = sim.ServeIngress(c)
			c.SetCorestores([]contracts.CorestoreOrigin{{NodeID: "node-a", Origin: origin}})
			c.Platform().SetCredential("node-a", credential)
			c.Platform().SetDesiredState(json.RawMessage(`{"capabilities":{},"providerConfigs":{"key":"` + credential + `"},"bindings":[]}`))
		},
		Build: func(cfg relay.Config, o relay.Options) (*relay.Relay, error) {
			esc, err := escrow.New(escrow.Options{Logger: o.Logger, Registerer: o.Registry})
			if err != nil {
				return nil, err
			}
			in, err := ingress.New(ingress.Options{Logger: o.Logger, Registerer: o.Registry})
			if err != nil {
				return nil, err
			}
			if rs, err = restore.New(port, restore.Options{Logger: o.Logger, Registerer: o.Registry}); err != nil {
				return nil, err
			}
			if hubKey, err = vpnkey.Generate(); err != nil {
				return nil, err
			}
			if hub, err = vpnhub.Listen(vpnhub.Config{Listen: "127.0.0.1:0", Key: hubKey}, vpnhub.Options{Logger: o.Logger, Registerer: o.Registry}); err != nil {
				return nil, err
			}
			if pf, err = platform.New(quietCorestore{}, platform.Options{Logger: o.Logger, Registerer: o.Registry}); err != nil {
				return nil, err
			}
			t.Cleanup(func() { pf.Close() })
			reg, err := registry.New(registry.Options{Upstream: "https://registry.example", CacheDir: t.TempDir(), CacheMaxBytes: 1 << 20,
				Logger: o.Logger, Registerer: o.Registry})
			if err != nil {
				hub.Close()
				return nil, err
			}
			return relay.New(cfg, relay.Features{Parts: []relay.Part{{Name: "escrow", Impl: esc}, {Name: "ingress", Impl: in}, {Name: "restore", Impl: rs}, {Name: "vpnhub", Impl: hub},
				{Name: "platform", Impl: pf}}, Registry: reg}, o)
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// escrow: a run of 23 renewals held for node-a.
	node := e.Node("node-a")
	run, err := sim.EscrowRun{Session: node.Session(), Start: time.Now()}.Request()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Cloudly.Call(ctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, run); err != nil {
		t.Fatal(err)
	}
	// ingress: one registered, and a route table of revision 9.
	control.Designate("node-i", ingressBearer)
	in := sim.NewIngress("node-i", ingressBearer, e.Log)
	if err := in.Connect(ctx, e.URL); err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if _, err := in.Register(ctx); err != nil {
		t.Fatal(err)
	}
	table := `{"revision":9,"certificates":[{"key":"` + tableSecret + `"}]}`
	if _, err := control.PushTable(ctx, json.RawMessage(table)); err != nil {
		t.Fatal(err)
	}
	// restore: one call waiting for the Corestore stand-in.
	e.Eventually("the relay knows node-a's Corestore", func() bool { return rs.Carried("node-a") })
	restored := make(chan error, 1)
	go func() {
		_, err := e.Cloudly.Call(ctx, contracts.MethodPrepareIsolatedRestoreOnNode,
			json.RawMessage(`{"nodeId":"node-a","control":{"grant":"`+grant+`"}}`))
		restored <- err
	}()
	defer func() { close(port.release); <-restored }()
	e.Eventually("the restore call reaches the Corestore", func() bool { return port.calls.Load() == 1 })
	// vpnhub: a membership of two pushed through the relay, one member joined.
	members, err := sim.NewVPNNodes(sim.SimVPNControlPrefix, e.Log, "node-a", "node-b")
	if err != nil {
		t.Fatal(err)
	}
	body := sim.VPNMembershipBody(sim.SimVPNAuthority, sim.SimVPNControlPrefix, 4, time.Now().Add(time.Hour).UnixMilli(), members)
	if _, err := e.Cloudly.Call(ctx, contracts.MethodPushClusterVpnMembership, body); err != nil {
		t.Fatal(err)
	}
	if err := members[0].Join(ctx, hub.Addr(), hubKey.Public, sim.SimVPNAuthority); err != nil {
		t.Fatal(err)
	}
	defer members[0].Close()

	// platform: enrolled, node-a's credential pushed and its desired state handed over.
	e.Eventually("node-a's desired state handed over", func() bool {
		st := pf.Status().(platform.Status)
		return st.Enrolled && len(st.Nodes) == 1 && st.Nodes[0].Credential && st.Nodes[0].Handed == 1
	})

	code, doc := statusGet(t, e, "/status.json")
	if code != 200 {
		t.Fatalf("/status.json: %d", code)
	}
	var st struct {
		Parts []struct {
			Name   string
			Ready  string
			Status json.RawMessage
		}
	}
	if err := json.Unmarshal([]byte(doc), &st); err != nil {
		t.Fatal(err)
	}
	parts := map[string]json.RawMessage{}
	for _, p := range st.Parts {
		parts[p.Name] = p.Status
	}
	var (
		esc struct {
			Runs, Renewals int
			Releasing      bool
			Nodes          []struct{ Node string }
		}
		ing struct {
			Connections int
			RouteTable  struct{ Revision int64 }
		}
		rst struct{ Inflight int }
		vpn struct{ Generation, Members, Sessions int }
		reg struct {
			Cache      string
			LimitBytes int64
		}
		plat struct {
			Enrolled bool
			Nodes    []struct {
				Node       string
				Credential bool
				Handed     int64
			}
		}
	)
	for name, v := range map[string]any{"escrow": &esc, "ingress": &ing, "restore": &rst, "vpnhub": &vpn, "registry": &reg, "platform": &plat} {
		if len(parts[name]) == 0 {
			t.Fatalf("/status.json has no status for %s:\n%s", name, doc)
		}
		if err := json.Unmarshal(parts[name], v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if esc.Runs != 1 || esc.Renewals != 23 || esc.Releasing || len(esc.Nodes) != 1 || esc.Nodes[0].Node != "node-a" {
		t.Fatalf("escrow: %s", parts["escrow"])
	}
	if ing.Connections != 1 || ing.RouteTable.Revision != 9 {
		t.Fatalf("ingress: %s", parts["ingress"])
	}
	if rst.Inflight != 1 {
		t.Fatalf("restore: %s", parts["restore"])
	}
	if vpn.Generation != 4 || vpn.Members != 2 || vpn.Sessions != 1 {
		t.Fatalf("vpnhub: %s", parts["vpnhub"])
	}
	if reg.Cache != "on" || reg.LimitBytes != 1<<20 {
		t.Fatalf("registry: %s", parts["registry"])
	}
	if !plat.Enrolled || len(plat.Nodes) != 1 || plat.Nodes[0].Node != "node-a" || !plat.Nodes[0].Credential || plat.Nodes[0].Handed != 1 {
		t.Fatalf("platform: %s", parts["platform"])
	}

	code, page := statusGet(t, e, "/status")
	if code != 200 {
		t.Fatalf("/status: %d", code)
	}
	for _, want := range []string{"<h2>escrow ", "<h2>ingress ", "<h2>restore ", "<h2>vpnhub ", "<h2>registry ", "<h2>platform ", "<th>handed</th>", "<th>delivered</th>", "<th>settled</th>",
		"<th>renewals</th><td>23</td>", "<th>revision</th><td>9</td>", "<th>inflight</th><td>1</td>",
		"<th>sessions</th><td>1</td>", "<th>cache</th><td>on</td>", "<td>node-a</td>"} {
		if !strings.Contains(page, want) {
			t.Errorf("/status does not show %q", want)
		}
	}

	secrets := []string{"bearer-node-a", ingressBearer, e.Cloudly.Token, "sim-signature", grant, tableSecret,
		"route-table-status-secret", origin, "corestore-origin-status-secret", credential}
	for _, k := range [][32]byte{hubKey.Private(), hubKey.Public, members[0].Key.Private(), members[0].Key.Public,
		members[1].Key.Private(), members[1].Key.Public} {
		secrets = append(secrets, contracts.EncodeKey32(k), base64.StdEncoding.EncodeToString(k[:]), contracts.ShortKey(k))
	}
	for _, s := range secrets {
		if strings.Contains(doc, s) || strings.Contains(page, s) {
			t.Errorf("the status page shows a secret (%.12s…)", s)
		}
	}
}

// quietCorestore is a platform Corestore port that takes every desired state and lists nothing.
type quietCorestore struct{}

func (quietCorestore) PutDesiredState(context.Context, string, contracts.Secret, []byte) error {
	return nil
}
func (quietCorestore) ReadyBackups(context.Context, string, contracts.Secret) ([]byte, error) {
	return []byte(`{"backups":[]}`), nil
}
func (quietCorestore) WantedRestores(context.Context, string, contracts.Secret) ([]byte, error) {
	return []byte(`{"restores":[]}`), nil
}
func (quietCorestore) MarkDelivered(context.Context, string, contracts.Secret, string) error {
	return nil
}
func (quietCorestore) OpenBackupClosure(context.Context, string, contracts.Secret, string) (io.ReadCloser, error) {
	return nil, contracts.RestoreNodeRefused.Refuse("none")
}
func (quietCorestore) PutRestoreClosure(context.Context, string, contracts.Secret, string, []byte, io.Reader) error {
	return contracts.RestoreNodeRefused.Refuse("none")
}

// waitingCorestore is a Corestore port that answers only when its context ends or release is
// closed.
type waitingCorestore struct {
	release chan struct{}
	calls   atomic.Int64
}

func (p *waitingCorestore) Call(ctx context.Context, _, _ string, _ json.RawMessage) (json.RawMessage, error) {
	p.calls.Add(1)
	select {
	case <-ctx.Done():
	case <-p.release:
	}
	return nil, contracts.RestoreNodeUnreachable.Refuse("the stand-in was let go")
}

func statusGet(t *testing.T, e *relaytest.Env, path string) (int, string) {
	t.Helper()
	x := &env{Env: e, t: t, relay: e.Relay}
	return x.admin(path)
}

// TestStatusPageInABrowser loads /status in a real headless Chromium while the relay carries
// nodes, and reads the attached state and the node count from the page it rendered; then, with
// Cloudly refusing the registration, the detach reason naming the refusal. CI installs Chromium
// (RELAY_REQUIRE_BROWSER=1 there); elsewhere the test skips without it, naming the command that
// installs it.
func TestStatusPageInABrowser(t *testing.T) {
	browser, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("RELAY_REQUIRE_BROWSER") == "1" {
			t.Fatal("chromium not found (RELAY_REQUIRE_BROWSER=1: apt-get install chromium)")
		}
		t.Skip("chromium not found: apt-get install chromium")
	}
	e := start(t, relay.Features{})
	for i := range 3 {
		e.node(fmt.Sprintf("node-%d", i))
	}
	dom := headless(t, browser, "--dump-dom", "http://"+e.relay.AdminAddr().String()+"/status")
	attached := regexp.MustCompile(`id="attached">([a-z]+)<`).FindStringSubmatch(dom)
	nodes := regexp.MustCompile(`id="nodes">(\d+)<`).FindStringSubmatch(dom)
	if attached == nil || attached[1] != "attached" || nodes == nil || nodes[1] != "3" {
		t.Fatalf("the browser rendered attached=%v nodes=%v:\n%s", attached, nodes, dom)
	}

	e.cloudly.SetRegistrationRefusal(contracts.RelayNodeForeign.Refuse("node relay-node is not in cluster-sim"))
	e.cloudly.Drop()
	e.eventually("the refusal on the status page", func() bool {
		_, page := e.admin("/status")
		return strings.Contains(page, "registration refused relay-node-foreign")
	})
	dom = headless(t, browser, "--dump-dom", "http://"+e.relay.AdminAddr().String()+"/status")
	attached = regexp.MustCompile(`id="attached">([a-z]+)<`).FindStringSubmatch(dom)
	reason := regexp.MustCompile(`id="detach-reason"[^>]*>([^<]+)<`).FindStringSubmatch(dom)
	if attached == nil || attached[1] != "detached" || reason == nil || !strings.HasPrefix(reason[1], "registration refused relay-node-foreign: ") {
		t.Fatalf("the browser rendered attached=%v reason=%v while Cloudly refuses the registration:\n%s", attached, reason, dom)
	}
}

// headless runs Chromium headless with the flags a closed network needs and returns its output.
func headless(t *testing.T, browser string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, append([]string{"--headless", "--no-sandbox", "--disable-gpu",
		"--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update",
		"--disable-sync", "--user-data-dir=" + filepath.Join(t.TempDir(), "profile")}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	return string(out)
}
