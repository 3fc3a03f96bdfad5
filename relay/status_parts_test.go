package relay_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/netip"
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
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
	"code.foss.global/serve.zone/relay/vpnhub"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

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
			if hub, err = vpnhub.Listen(vpnhub.Config{Listen: "127.0.0.1:0", Key: hubKey, ReportAddress: netip.MustParseAddr("192.0.2.1")}, vpnhub.Options{Logger: o.Logger, Registerer: o.Registry}); err != nil {
				return nil, err
			}
			ep := hub.Endpoint()
			o.VPNHub, o.VPNHubBound = &ep, hub.Addr().String()
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
		"<th>sessions</th><td>1</td>", "<th>cache</th><td>on</td>", "<td>node-a</td>",
		// The parts' facts read for people: keys in words, sizes with units, booleans, times.
		"<th>releases while detached</th>", "<th>releasing</th><td>no</td>", "<th>limit bytes</th><td>1.0 MiB</td>",
		"<th>held until</th>", "<th>closures inflight</th>",
		`<td id="hub">bound to ` + hub.Addr().String() + ", reported to Cloudly as "} {
		if !strings.Contains(page, want) {
			t.Errorf("/status does not show %q", want)
		}
	}
	if m := notForPeople.FindString(page); m != "" {
		t.Errorf("/status shows %q: a raw timestamp or a camelCase label", m)
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
