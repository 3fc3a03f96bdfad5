package relaymodule_test

import (
	"bytes"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "code.foss.global/serve.zone/relay"

// layers says, for each package of this module, its floor and what it may import: own packages
// (each on a lower floor: nothing imports upwards or sideways, so there is no cycle) and
// third-party ones. Dependencies point inward: the strict JSON library, contracts on it and the
// ground-floor libraries at the centre, the ports above them, the parts beside each other, relay wiring them, the daemon
// wiring the relay from flags, test support above it, and the commands on top.
const (
	libs     = iota // libraries contracts itself builds on: the strict JSON reader
	ground          // contracts and the libraries that import nothing of ours
	ports           // the seams and keys everything above builds on
	codecs          // the VPN's wire format, on its keys
	parts           // the features, beside each other
	core            // relay: wires the upstream, the downstream and the parts
	wiring          // daemon: flags into a running relay, its features and its election
	harness         // simulated peers and harnesses (testenv), the interop peers
	harness2        // what stands on a harness: the relay harness, the fault suite
	top             // the commands: cmd/relay (the daemon), cmd/relay-dev (the demo)
)

type layer struct {
	floor     int
	own       []string
	third     []string
	testsOnly bool
}

var layers = map[string]layer{
	"contracts/strictjson": {floor: libs},
	"contracts":            {floor: ground, own: []string{"contracts/strictjson"}},
	"internal/backoff":     {floor: ground},
	"internal/budget":      {floor: ground},
	"vpnhub/quicsock":      {floor: ground, third: []string{"golang.org/x/net", "golang.org/x/sys"}},
	"feature":              {floor: ports, own: []string{"contracts"}},
	"internal/typedsocket": {floor: ports, own: []string{"contracts", "contracts/strictjson"}, third: []string{"github.com/coder/websocket", "github.com/rs/zerolog", "golang.org/x/sys"}},
	"internal/vstream":     {floor: ports, own: []string{"contracts", "contracts/strictjson"}, third: []string{"k8s.io/utils"}},
	"vpnhub/vpnkey":        {floor: ports, own: []string{"contracts"}, third: []string{"github.com/rs/zerolog"}},
	"vpnhub/internal/wire": {floor: codecs, own: []string{"contracts", "vpnhub/vpnkey"}, third: []string{"github.com/quic-go/quic-go", "github.com/flynn/noise", "golang.org/x/crypto"}},
	"escrow":               {floor: parts, own: []string{"contracts", "feature", "contracts/strictjson"}, third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog"}},
	"ingress":              {floor: parts, own: []string{"contracts", "feature", "contracts/strictjson"}, third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog"}},
	"restore":              {floor: parts, own: []string{"contracts", "feature"}, third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog"}},
	"platform":             {floor: parts, own: []string{"contracts", "feature", "internal/vstream", "contracts/strictjson"}, third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog", "k8s.io/utils"}},
	"corestore":            {floor: parts, own: []string{"contracts", "contracts/strictjson"}, third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog", "k8s.io/utils"}},
	"registry":             {floor: parts, own: []string{"contracts", "contracts/strictjson"}, third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog", "golang.org/x/sync"}},
	"vpnhub":               {floor: parts, own: []string{"contracts", "feature", "vpnhub/quicsock", "vpnhub/internal/wire", "vpnhub/vpnkey"}, third: []string{"github.com/quic-go/quic-go", "github.com/prometheus/client_golang", "github.com/rs/zerolog"}},
	"vpnhub/client":        {floor: parts, own: []string{"contracts", "internal/backoff", "vpnhub/quicsock", "vpnhub/internal/wire", "vpnhub/vpnkey"}, third: []string{"github.com/quic-go/quic-go", "github.com/rs/zerolog", "golang.org/x/sys", "golang.zx2c4.com/wireguard/tun", "k8s.io/utils"}},
	"vpnhub/vpntest":       {floor: parts, own: []string{"contracts", "vpnhub/vpnkey"}, third: []string{"github.com/rs/zerolog", "go.uber.org/goleak"}, testsOnly: true},
	"ha":                   {floor: parts, own: []string{"feature", "internal/backoff"}, third: []string{"github.com/flynn/noise", "github.com/go-logr/logr", "github.com/prometheus/client_golang", "github.com/rs/zerolog", "k8s.io/api", "k8s.io/apimachinery", "k8s.io/client-go", "k8s.io/klog", "k8s.io/utils"}},
	"status":               {floor: parts, third: []string{"github.com/prometheus/client_golang", "github.com/prometheus/client_model", "github.com/rs/zerolog"}}, // the admin listener and status page: reads a snapshot the core fills
	"relay":                {floor: core, own: []string{"contracts", "feature", "internal/backoff", "internal/budget", "internal/typedsocket", "status"}, third: []string{"github.com/coder/websocket", "github.com/prometheus/client_golang", "github.com/prometheus/client_model", "github.com/rs/zerolog", "golang.org/x/sync", "golang.org/x/time"}},
	"testenv":              {floor: harness},
	"testenv/await":        {floor: harness},
	"testenv/memnet":       {floor: harness},
	"testenv/frames":       {floor: harness},
	"testenv/sim":          {floor: harness, own: []string{"contracts", "contracts/strictjson", "internal/typedsocket", "internal/vstream", "vpnhub/client", "vpnhub/vpnkey"}, third: []string{"github.com/coder/websocket", "github.com/rs/zerolog", "golang.org/x/sync"}},
	"testenv/kubeapi":      {floor: harness, third: []string{"k8s.io/api", "k8s.io/apimachinery", "k8s.io/client-go"}},
	"interop":              {floor: harness, own: []string{"contracts"}}, // runs Node.js peers and a relay binary; imports neither
	"testenv/relaytest":    {floor: harness2, own: []string{"contracts", "relay", "testenv/await", "testenv/sim"}, third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog"}},
	"faults":               {floor: harness2, testsOnly: true},
	"faults/failover":      {floor: harness2, testsOnly: true}, // several relay processes against a real API server
	"charts/relay":         {floor: harness2, testsOnly: true}, // the chart against a real API server
	"daemon": {floor: wiring, own: []string{"contracts", "corestore", "escrow", "feature", "ha", "ingress", "platform", "registry", "relay", "restore", "vpnhub", "vpnhub/vpnkey"},
		third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog", "k8s.io/client-go"}},
	"cmd/relay": {floor: top, own: []string{"daemon", "relay"}},
	"cmd/relay-dev": {floor: top, own: []string{"daemon", "ha", "relay", "testenv/kubeapi", "testenv/sim", "vpnhub", "vpnhub/vpnkey"},
		third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog", "k8s.io/api", "k8s.io/client-go"}},
}

// TestDependencyDirection fails when a package imports what its layer does not allow: contracts
// anything but the standard library, a feature package another feature package, and so on.
func TestDependencyDirection(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(strings.TrimPrefix(fields[0], module), "/")
		if pkg == "" || strings.HasPrefix(pkg, "bench") {
			continue
		}
		seen[pkg] = true
		layer, ok := layers[pkg]
		if !ok {
			t.Errorf("package %s has no layer in deps_test.go: add it", pkg)
			continue
		}
		for _, imp := range fields[1:] {
			if own, ok := strings.CutPrefix(imp, module+"/"); ok {
				if !contains(layer.own, own) {
					t.Errorf("%s imports %s, which its layer does not allow", pkg, own)
				}
				if to, ok := layers[own]; ok && to.floor >= layer.floor {
					t.Errorf("%s (floor %d) imports %s (floor %d): an import runs sideways or upwards", pkg, layer.floor, own, to.floor)
				}
				continue
			}
			if first := strings.Split(imp, "/")[0]; !strings.Contains(first, ".") {
				continue // standard library
			}
			if !hasPrefixIn(imp, layer.third) {
				t.Errorf("%s imports third-party %s, which its layer does not allow", pkg, imp)
			}
		}
	}
	for _, must := range []string{"contracts", "relay", "internal/typedsocket", "testenv/sim"} {
		if !seen[must] {
			t.Errorf("package %s not found by go list", must)
		}
	}
}

// testSupport reports whether pkg (an import path) is test support: the harness floors (the
// simulated peers, the test API server, the relay harness, the fault suites), a package only tests
// use, the standard library's test packages and goleak.
func testSupport(pkg string) bool {
	if own, ok := strings.CutPrefix(pkg, module+"/"); ok {
		l, known := layers[own]
		return strings.HasPrefix(own, "testenv/") || known && (l.testsOnly || l.floor == harness || l.floor == harness2)
	}
	switch pkg {
	case "testing", "testing/synctest", "testing/fstest", "testing/iotest", "testing/quick", "net/http/httptest":
		return true
	}
	return hasPrefixIn(pkg, []string{"go.uber.org/goleak"})
}

// TestDaemonLinksNoTestSupport fails when the binary operators deploy, cmd/relay, links test
// support or the demo: a simulated Cloudly, the test Kubernetes API server, the VPN client the
// simulated nodes dial with, the testing package. Only the build's packages count (go list -deps
// without -test): tests of the daemon may stand on a harness.
func TestDaemonLinksNoTestSupport(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./cmd/relay").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	for _, pkg := range deps {
		if testSupport(pkg) || pkg == module+"/vpnhub/client" || pkg == module+"/cmd/relay-dev" {
			t.Errorf("cmd/relay links %s: the daemon carries no test support (the demo is cmd/relay-dev)", pkg)
		}
	}
	if !contains(deps, module+"/daemon") || !contains(deps, module+"/relay") || len(deps) < 100 {
		t.Fatalf("go list -deps ./cmd/relay lists %d packages without the daemon and the relay: the scan is broken", len(deps))
	}
}

// TestNoLibraryImportsTestSupport fails when a package below the harnesses (a library, a feature,
// the relay, the daemon) or cmd/relay imports test support in its build (its tests may).
func TestNoLibraryImportsTestSupport(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(strings.TrimPrefix(fields[0], module), "/")
		l, ok := layers[pkg]
		if !ok || testSupport(fields[0]) || pkg != "cmd/relay" && l.floor >= harness {
			continue
		}
		checked++
		for _, imp := range fields[1:] {
			if testSupport(imp) {
				t.Errorf("%s imports %s, which is test support", pkg, imp)
			}
		}
	}
	if checked < 15 {
		t.Fatalf("only %d packages checked: the scan is broken", checked)
	}
}

// TestNoFolderImportCycle fails when the folders import each other round in a circle, at any
// depth: each package counts as its folder (relay/, vpnhub/, testenv/; at the next depth
// vpnhub/client/, testenv/sim/, ...), and a folder's imports are its packages' imports, tests
// left out. Go refuses a cycle of packages; this refuses one of rooms, such as a feature whose
// subpackage imports the relay that imports the feature.
func TestNoFolderImportCycle(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	type edge struct{ from, to string }
	var edges []edge
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		from := strings.TrimPrefix(strings.TrimPrefix(fields[0], module), "/")
		for _, imp := range fields[1:] {
			if to, ok := strings.CutPrefix(imp, module+"/"); ok && from != "" {
				edges = append(edges, edge{from, to})
			}
		}
	}
	if len(edges) < 50 {
		t.Fatalf("only %d imports of our own: the scan is broken", len(edges))
	}
	folder := func(pkg string, depth int) string {
		parts := strings.Split(pkg, "/")
		return strings.Join(parts[:min(depth, len(parts))], "/")
	}
	for depth := 1; depth <= 3; depth++ {
		graph := map[string][]string{}
		for _, e := range edges {
			a, b := folder(e.from, depth), folder(e.to, depth)
			if a != b && !slices.Contains(graph[a], b) {
				graph[a] = append(graph[a], b)
			}
		}
		if cycle := findCycle(graph); cycle != nil {
			t.Errorf("the folders import each other in a circle (depth %d): %s", depth, strings.Join(cycle, " → "))
		}
	}
}

// findCycle returns one cycle of graph, its first node repeated last; nil when there is none.
func findCycle(graph map[string][]string) []string {
	const (
		unseen = iota
		open
		done
	)
	state := map[string]int{}
	var path []string
	var visit func(n string) []string
	visit = func(n string) []string {
		state[n] = open
		path = append(path, n)
		for _, m := range graph[n] {
			switch state[m] {
			case open:
				i := slices.Index(path, m)
				return append(slices.Clone(path[i:]), m)
			case unseen:
				if c := visit(m); c != nil {
					return c
				}
			}
		}
		path = path[:len(path)-1]
		state[n] = done
		return nil
	}
	nodes := make([]string, 0, len(graph))
	for n := range graph {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	for _, n := range nodes {
		if state[n] == unseen {
			if c := visit(n); c != nil {
				return c
			}
		}
	}
	return nil
}

// TestGofmt fails on any Go file gofmt would change.
func TestGofmt(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "." || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		want, err := format.Source(src)
		if err != nil {
			t.Errorf("%s: %v", path, err)
		} else if !bytes.Equal(src, want) {
			t.Errorf("%s is not gofmt-formatted", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func hasPrefixIn(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if s == p || strings.HasPrefix(s, p+"/") {
			return true
		}
	}
	return false
}

// logField finds a zerolog field name in a log event chain (not in a flag definition).
var logField = regexp.MustCompile(`(?:[)\]]|\b(?:ev|e|l|log|event|lg))\s*\.(?:Str|Strs|Int|Int64|Uint64|Dur|Bool|Float64|Stringer|Time|Hex)\("([a-z_A-Z]+)"`)

// TestLogFieldsAreDocumented fails when the relay logs a field docs/logging.md does not list: the
// log vocabulary is fixed, so that a dashboard or an alert can rely on it.
func TestLogFieldsAreDocumented(t *testing.T) {
	doc, err := os.ReadFile("docs/logging.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, dir := range []string{"relay", "escrow", "ingress", "restore", "platform", "corestore", "registry", "vpnhub", "vpnhub/client", "vpnhub/vpnkey", "internal/typedsocket", "daemon", "cmd/relay-dev"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range logField.FindAllStringSubmatch(string(src), -1) {
				seen++
				if !strings.Contains(string(doc), "`"+m[1]+"`") {
					t.Errorf("%s logs the field %q, which docs/logging.md does not list", f, m[1])
				}
			}
		}
	}
	if seen < 20 {
		t.Fatalf("only %d log fields found: the scan is broken", seen)
	}
}
