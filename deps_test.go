package relaymodule_test

import (
	"bytes"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const module = "code.foss.global/serve.zone/relay"

// layers says, for each package of this module, its floor and what it may import: own packages
// (each on a lower floor: nothing imports upwards or sideways, so there is no cycle) and
// third-party ones. Dependencies point inward: contracts and the ground-floor libraries at the
// centre, the ports above them, the parts beside each other, relay wiring them, test support and
// cmd/relay on top.
const (
	ground   = iota // contracts and the libraries that import nothing of ours
	ports           // the seams and keys everything above builds on
	codecs          // the VPN's wire format, on its keys
	parts           // the features, beside each other
	core            // relay: wires the upstream, the downstream and the parts
	harness         // simulated peers and harnesses (testenv), the interop peers
	harness2        // what stands on a harness: the relay harness, the fault suite
	top             // cmd/relay
)

type layer struct {
	floor     int
	own       []string
	third     []string
	testsOnly bool
}

var layers = map[string]layer{
	"contracts":            {floor: ground},
	"internal/backoff":     {floor: ground},
	"internal/budget":      {floor: ground},
	"vpnhub/quicsock":      {floor: ground, third: []string{"golang.org/x/net", "golang.org/x/sys"}},
	"feature":              {floor: ports, own: []string{"contracts"}},
	"internal/typedsocket": {floor: ports, own: []string{"contracts"}, third: []string{"github.com/coder/websocket", "github.com/rs/zerolog"}},
	"internal/vstream":     {floor: ports, own: []string{"contracts"}, third: []string{"k8s.io/utils"}},
	"vpnhub/vpnkey":        {floor: ports, own: []string{"contracts"}, third: []string{"github.com/rs/zerolog"}},
	"vpnhub/internal/wire": {floor: codecs, own: []string{"contracts", "vpnhub/vpnkey"}, third: []string{"github.com/quic-go/quic-go", "github.com/flynn/noise", "golang.org/x/crypto"}},
	"escrow":               {floor: parts, own: []string{"contracts", "feature"}, third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog"}},
	"ingress":              {floor: parts, own: []string{"contracts", "feature"}, third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog"}},
	"restore":              {floor: parts, own: []string{"contracts", "feature"}, third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog"}},
	"platform":             {floor: parts, own: []string{"contracts", "feature", "internal/vstream"}, third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog", "k8s.io/utils"}},
	"corestore":            {floor: parts, own: []string{"contracts"}, third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog"}},
	"registry":             {floor: parts, own: []string{"contracts"}, third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog", "golang.org/x/sync"}},
	"vpnhub":               {floor: parts, own: []string{"contracts", "feature", "vpnhub/quicsock", "vpnhub/internal/wire", "vpnhub/vpnkey"}, third: []string{"github.com/quic-go/quic-go", "github.com/prometheus/client_golang", "github.com/rs/zerolog"}},
	"vpnhub/client":        {floor: parts, own: []string{"contracts", "internal/backoff", "vpnhub/quicsock", "vpnhub/internal/wire", "vpnhub/vpnkey"}, third: []string{"github.com/quic-go/quic-go", "github.com/rs/zerolog", "golang.org/x/sys", "golang.zx2c4.com/wireguard/tun"}},
	"vpnhub/vpntest":       {floor: parts, own: []string{"contracts", "vpnhub/vpnkey"}, third: []string{"github.com/rs/zerolog", "go.uber.org/goleak"}, testsOnly: true},
	"ha":                   {floor: parts, own: []string{"feature", "internal/backoff"}, third: []string{"github.com/flynn/noise", "github.com/go-logr/logr", "github.com/prometheus/client_golang", "github.com/rs/zerolog", "k8s.io/api", "k8s.io/apimachinery", "k8s.io/client-go", "k8s.io/klog", "k8s.io/utils"}},
	"relay":                {floor: core, own: []string{"contracts", "feature", "internal/backoff", "internal/budget", "internal/typedsocket"}, third: []string{"github.com/coder/websocket", "github.com/prometheus/client_golang", "github.com/prometheus/client_model", "github.com/rs/zerolog", "golang.org/x/sync"}},
	"testenv":              {floor: harness},
	"testenv/await":        {floor: harness},
	"testenv/sim":          {floor: harness, own: []string{"contracts", "internal/typedsocket", "internal/vstream", "vpnhub/client", "vpnhub/vpnkey"}, third: []string{"github.com/coder/websocket", "github.com/rs/zerolog", "golang.org/x/sync"}},
	"testenv/kubeapi":      {floor: harness, third: []string{"k8s.io/api", "k8s.io/apimachinery", "k8s.io/client-go"}},
	"interop":              {floor: harness, own: []string{"contracts"}}, // runs Node.js peers and a relay binary; imports neither
	"testenv/relaytest":    {floor: harness2, own: []string{"contracts", "relay", "testenv/await", "testenv/sim"}, third: []string{"github.com/prometheus/client_golang", "github.com/rs/zerolog"}},
	"faults":               {floor: harness2, testsOnly: true},
	"faults/failover":      {floor: harness2, testsOnly: true}, // several relay processes against a real API server
	"charts/relay":         {floor: harness2, testsOnly: true}, // the chart against a real API server
	"cmd/relay":            {floor: top},
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
				if pkg == "cmd/relay" {
					continue // the one place everything is wired together
				}
				if !contains(layer.own, own) {
					t.Errorf("%s imports %s, which its layer does not allow", pkg, own)
				}
				if to, ok := layers[own]; ok && to.floor >= layer.floor {
					t.Errorf("%s (floor %d) imports %s (floor %d): an import runs sideways or upwards", pkg, layer.floor, own, to.floor)
				}
				continue
			}
			if pkg == "cmd/relay" {
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
	for _, dir := range []string{"relay", "escrow", "ingress", "restore", "platform", "corestore", "registry", "vpnhub", "vpnhub/client", "vpnhub/vpnkey", "internal/typedsocket", "cmd/relay"} {
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
