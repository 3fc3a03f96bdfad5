package daemon

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/relay"
)

// recorder registers collectors in a registry and keeps every metric description.
type recorder struct {
	prometheus.Registerer
	descs []*prometheus.Desc
}

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		r.descs = append(r.descs, d)
	}
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var descFields = regexp.MustCompile(`fqName: "([^"]+)", help: "((?:[^"\\]|\\.)*)", (?:unit: "[^"]*", )?constLabels: \{[^}]*\}, variableLabels: \{([^}]*)\}`)

// TestOperatingDocListsEveryMetric builds a relay with every part on and checks that
// docs/operating.md lists each metric it registers, with its help text, as generated here.
// UPDATE_DOCS=1 rewrites the list.
func TestOperatingDocListsEveryMetric(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("jwt"), 0o600)
	cfg := Config{Config: relay.Config{ClusterID: "c", NodeID: "n", CloudlyURL: "ws://127.0.0.1:1/", CloudlyTokenFile: token,
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true,
		RegistryUpstream: "http://127.0.0.1:1", HubListen: "127.0.0.1:0"},
		RegistryCacheDir: filepath.Join(dir, "cache"), HubKeyFile: filepath.Join(dir, "hub.key")}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{Registerer: relay.NewRegistry()}
	_, hub, err := BuildParts(cfg, relay.Options{Logger: zerolog.Nop(), Registerer: rec}, netip.MustParseAddr("192.0.2.1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	hub.Close()
	var rows []string
	for _, d := range rec.descs {
		m := descFields.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		labels := ""
		if m[3] != "" {
			labels = "`" + strings.ReplaceAll(m[3], ",", "`, `") + "`"
		}
		rows = append(rows, fmt.Sprintf("| `%s` | %s | %s |", m[1], labels, strings.ReplaceAll(m[2], `\"`, `"`)))
	}
	slices.Sort(rows)
	rows = slices.Compact(rows)
	table := "| metric | labels | meaning |\n| --- | --- | --- |\n" + strings.Join(rows, "\n") + "\n"

	const path = "../docs/operating.md"
	const marker = "<!-- metrics: generated and checked by daemon TestOperatingDocListsEveryMetric -->\n"
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	head, current, ok := strings.Cut(string(doc), marker)
	if !ok {
		t.Fatalf("%s lacks the metrics marker", path)
	}
	if os.Getenv("UPDATE_DOCS") == "1" {
		os.WriteFile(path, []byte(head+marker+"\n"+table), 0o644)
		return
	}
	if strings.TrimSpace(current) != strings.TrimSpace(table) {
		t.Fatalf("docs/operating.md's metric list is out of date; run UPDATE_DOCS=1 go test ./daemon -run OperatingDoc\nwant:\n%s", table)
	}
}
