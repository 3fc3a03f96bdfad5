package relay

import (
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/escrow"
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/ingress"
	"code.foss.global/serve.zone/relay/platform"
	"code.foss.global/serve.zone/relay/registry"
	"code.foss.global/serve.zone/relay/restore"
	"code.foss.global/serve.zone/relay/vpnhub"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// What each part is to the relay, checked when the tests build: a changed signature in a part's
// package would otherwise make it silently stop serving, hearing or running.
var (
	_ feature.Server           = (*escrow.Escrow)(nil)
	_ feature.CloudlyServer    = (*escrow.Escrow)(nil)
	_ feature.DownstreamServer = (*escrow.Escrow)(nil)
	_ feature.UpstreamUser     = (*escrow.Escrow)(nil)
	_ feature.AttachWatcher    = (*escrow.Escrow)(nil)
	_ feature.DetachWatcher    = (*escrow.Escrow)(nil)
	_ feature.CustodyWatcher   = (*escrow.Escrow)(nil)
	_ feature.NodeWatcher      = (*escrow.Escrow)(nil)
	_ feature.Component        = (*escrow.Escrow)(nil)

	_ feature.Server           = (*ingress.Server)(nil)
	_ feature.CloudlyServer    = (*ingress.Server)(nil)
	_ feature.DownstreamServer = (*ingress.Server)(nil)
	_ feature.AttachWatcher    = (*ingress.Server)(nil)
	_ feature.PeerWatcher      = (*ingress.Server)(nil)

	_ feature.Server        = (*restore.Restore)(nil)
	_ feature.CloudlyServer = (*restore.Restore)(nil)
	_ feature.ConfigWatcher = (*restore.Restore)(nil)
	_ feature.Component     = (*restore.Restore)(nil)

	_ feature.Server        = (*vpnhub.Hub)(nil)
	_ feature.CloudlyServer = (*vpnhub.Hub)(nil)
	_ feature.Component     = (*vpnhub.Hub)(nil)

	_ feature.Component = (*registry.Registry)(nil)

	_ feature.Reporter = (*escrow.Escrow)(nil)
	_ feature.Reporter = (*ingress.Server)(nil)
	_ feature.Reporter = (*restore.Restore)(nil)
	_ feature.Reporter = (*vpnhub.Hub)(nil)
	_ feature.Reporter = (*registry.Registry)(nil)

	_ http.Handler = (*registry.Registry)(nil)
)

// everyFeature builds every feature the relay has, as cmd/relay does, without running them.
func everyFeature(t *testing.T) Features {
	t.Helper()
	esc, err := escrow.New(escrow.Options{})
	if err != nil {
		t.Fatal(err)
	}
	in, err := ingress.New(ingress.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := restore.New(nil, restore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key, err := vpnkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	hub, err := vpnhub.Listen(vpnhub.Config{Listen: "127.0.0.1:0", Key: key}, vpnhub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hub.Close() })
	reg, err := registry.New(registry.Options{Upstream: "https://registry.example"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	pf, err := platform.New(nil, platform.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pf.Close() })
	return Features{Parts: []Part{{Name: "escrow", Impl: esc}, {Name: "ingress", Impl: in}, {Name: "restore", Impl: rs}, {Name: "vpnhub", Impl: hub},
		{Name: "platform", Impl: pf}}, Registry: reg}
}

// contractsMethods is every method name contracts spells: the value of each Method… constant.
func contractsMethods(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "contracts", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var methods []string
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			spec, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, id := range spec.Names {
				if !strings.HasPrefix(id.Name, "Method") || i >= len(spec.Values) {
					continue
				}
				if lit, ok := spec.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if m, err := strconv.Unquote(lit.Value); err == nil {
						methods = append(methods, m)
					}
				}
			}
			return true
		})
	}
	if len(methods) < 20 {
		t.Fatalf("found only %d method constants in contracts", len(methods))
	}
	return methods
}

// TestDispatch: with every feature on, the relay serves exactly the methods contracts names as
// served to Cloudly, so a method that is served but not listed is never forwarded to a node.
func TestDispatch(t *testing.T) {
	t.Run("with every feature on, the Cloudly table is exactly the methods served to Cloudly", func(t *testing.T) {
		r, err := New(Config{InsecurePlaintext: true}, everyFeature(t), Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range contractsMethods(t) {
			_, listed := r.parts.methods.fromCloudly[m]
			switch served := contracts.IsServedToCloudly(m); {
			case served && !listed:
				t.Errorf("%s is served to Cloudly, but no feature lists it: Cloudly's request would be refused as if its part were off", m)
			case listed && !served:
				t.Errorf("%s is in the Cloudly table, but contracts does not name it as served", m)
			}
		}
		var table []string
		for m := range r.parts.methods.fromCloudly {
			table = append(table, m)
		}
		sort.Strings(table)
		t.Logf("served to Cloudly: %s", strings.Join(table, ", "))
	})

	t.Run("a method two parts serve fails New", func(t *testing.T) {
		f := everyFeature(t)
		f.Parts = append(f.Parts, Part{Name: "fake", Impl: fakeFeature{fromDownstream: []string{contracts.MethodGetClusterIngressRouteTable}}})
		if _, err := New(Config{InsecurePlaintext: true}, f, Options{}); err == nil {
			t.Fatal("two features serving getClusterIngressRouteTable were accepted")
		}
		f.Parts[len(f.Parts)-1] = Part{Name: "fake", Impl: fakeFeature{fromDownstream: []string{contracts.MethodRegisterPalletRuntimeSession}}}
		if _, err := New(Config{InsecurePlaintext: true}, f, Options{}); err == nil {
			t.Fatal("a feature serving the relay's own node registration was accepted")
		}
	})

	t.Run("a Cloudly method contracts does not name as served fails New", func(t *testing.T) {
		f := Features{Parts: []Part{{Name: "fake", Impl: fakeFeature{fromCloudly: []string{"applyRuntimeAssignment"}}}}}
		if _, err := New(Config{InsecurePlaintext: true}, f, Options{}); err == nil {
			t.Fatal("a feature taking applyRuntimeAssignment from Cloudly was accepted: it would never reach its node")
		}
	})
}

// fakeFeature lists methods and serves none of them.
type fakeFeature struct{ fromCloudly, fromDownstream []string }

func (f fakeFeature) Methods() ([]string, []string) { return f.fromCloudly, f.fromDownstream }
func (fakeFeature) ServeCloudly(_ string, _ json.RawMessage, reply feature.Reply) {
	reply(nil, nil)
}
func (fakeFeature) ServeDownstream(_ string, _ feature.Peer, _ json.RawMessage, reply feature.Reply) {
	reply(nil, nil)
}

// TestMethodTable: the method table serves from Cloudly exactly the methods contracts names as
// served to Cloudly, and refuses by its row's name a method whose part is off, from either side.
func TestMethodTable(t *testing.T) {
	for _, m := range contractsMethods(t) {
		row, ok := ruleFor(m)
		if served := contracts.IsServedToCloudly(m); served != (ok && row.from&fromCloudly != 0) {
			t.Errorf("%s: served to Cloudly is %v in contracts, but the method table says %+v", m, served, row)
		}
	}
	for _, c := range []struct {
		method string
		from   side
		want   contracts.RefusalName
	}{
		{contracts.MethodPushClusterVpnMembership, fromCloudly, contracts.RelayVPNHubOff},
		{contracts.MethodPushClusterVpnMembership, fromDownstream, contracts.RelayMethodUnknown},
		{contracts.MethodPushClusterRouteTable, fromCloudly, contracts.RelayMethodUnknown},
		{contracts.MethodRegisterClusterIngress, fromDownstream, contracts.RelayMethodUnknown},
		{contracts.MethodRegisterClusterIngress, fromCloudly, contracts.RelayMethodUnknown},
	} {
		if err := methodTable[c.method].offRefusal(c.method, c.from); !errors.Is(err, c.want) {
			t.Errorf("%s from %s with its part off: %v, want %s", c.method, c.from, err, c.want)
		}
	}
	if methodTable[contracts.MethodRegisterClusterIngress].role != roleIngress || methodTable[contracts.MethodRegisterPalletRuntimeSession].role != roleNode {
		t.Error("the registrations do not decide their connection's role")
	}
}

var (
	_ feature.LeadWatcher = (*escrow.Escrow)(nil)
	_ feature.Rebinder    = (*escrow.Escrow)(nil)
	_ feature.Replicated  = (*escrow.Escrow)(nil)
)
