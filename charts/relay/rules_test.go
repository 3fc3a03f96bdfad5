package chart

import (
	"bytes"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"code.foss.global/serve.zone/relay/ha"
)

// The PrometheusRule's alerts query only what the relay exports. The rule as rendered with
// ha.enabled (every alert) is testdata/prometheusrule.golden.yaml, which test.sh keeps equal to
// the template and checks with promtool; here each relay_* name it queries must be a metric of
// the relay: in docs/operating.md's generated table (checked against a single relay's registry
// by daemon TestOperatingDocListsEveryMetric) or one the election registers, and each label it
// groups or matches on one of its metrics' or a scrape target's.

const (
	ruleGolden     = "testdata/prometheusrule.golden.yaml"
	operatingDoc   = "../../docs/operating.md"
	metricsMarker  = "<!-- metrics: generated and checked by daemon TestOperatingDocListsEveryMetric -->"
	certExpiryName = "relay_downstream_certificate_expiry_timestamp_seconds"
)

// targetLabels are the labels Prometheus Operator gives every series the ServiceMonitor scrapes.
var targetLabels = []string{"namespace", "job", "pod", "instance", "service", "endpoint", "container"}

var (
	docRow       = regexp.MustCompile("^\\| `(relay_[a-z0-9_]+)` \\| ([^|]*) \\|")
	relayMetric  = regexp.MustCompile(`\b(relay_[a-z0-9_]+)\b(\{[^}]*\})?`)
	groupingList = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	matcherLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
)

// relayMetrics maps every relay_* metric to its labels: docs/operating.md's table, and the HA
// metrics from the registry an elector registers into (a client is needed to build one; it is
// never called).
func relayMetrics(t *testing.T) map[string][]string {
	t.Helper()
	doc, err := os.ReadFile(operatingDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), metricsMarker)
	if !ok {
		t.Fatalf("%s lacks the metrics marker", operatingDoc)
	}
	metrics := map[string][]string{}
	for line := range strings.SplitSeq(table, "\n") {
		if m := docRow.FindStringSubmatch(line); m != nil {
			var labels []string
			for l := range strings.SplitSeq(m[2], ",") {
				if l = strings.Trim(strings.TrimSpace(l), "`"); l != "" {
					labels = append(labels, l)
				}
			}
			metrics[m[1]] = labels
		}
	}
	if len(metrics) < 20 {
		t.Fatalf("read only %d metrics from %s's table", len(metrics), operatingDoc)
	}
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if _, err := ha.New(ha.Config{LeaseName: "relay", Namespace: "relay-system", Identity: "relay-0", Client: client, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		var labels []string
		if len(f.Metric) > 0 {
			for _, l := range f.Metric[0].Label {
				labels = append(labels, l.GetName())
			}
		}
		metrics[f.GetName()] = labels
	}
	if _, ok := metrics["relay_ha_leader"]; !ok {
		t.Fatal("the elector registered no relay_ha_leader")
	}
	return metrics
}

type alertRule struct {
	Alert  string            `json:"alert"`
	Expr   string            `json:"expr"`
	Labels map[string]string `json:"labels"`
}

func readRules(t *testing.T) []alertRule {
	t.Helper()
	raw, err := os.ReadFile(ruleGolden)
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []struct {
				Rules []alertRule `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096).Decode(&rule); err != nil {
		t.Fatalf("%s: %v", ruleGolden, err)
	}
	if rule.Kind != "PrometheusRule" {
		t.Fatalf("%s holds a %q, not a PrometheusRule", ruleGolden, rule.Kind)
	}
	var rules []alertRule
	for _, g := range rule.Spec.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

// queryProblems reports the relay_* names expr uses that the relay does not export, and the
// labels it groups or matches on that none of its metrics or the scrape target carries; and the
// names it uses.
func queryProblems(metrics map[string][]string, expr string) (problems, used []string) {
	allowed := slices.Clone(targetLabels)
	for _, m := range relayMetric.FindAllStringSubmatch(expr, -1) {
		labels, ok := metrics[m[1]]
		if !ok {
			problems = append(problems, "metric "+m[1]+" is neither in docs/operating.md's table nor an HA metric")
			continue
		}
		used = append(used, m[1])
		allowed = append(allowed, labels...)
	}
	var named []string
	for _, g := range groupingList.FindAllStringSubmatch(expr, -1) {
		for l := range strings.SplitSeq(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				named = append(named, l)
			}
		}
	}
	for _, m := range relayMetric.FindAllStringSubmatch(expr, -1) {
		for _, l := range matcherLabel.FindAllStringSubmatch(m[2], -1) {
			named = append(named, l[1])
		}
	}
	for _, l := range named {
		if !slices.Contains(allowed, l) {
			problems = append(problems, "label "+l+" is on none of its metrics")
		}
	}
	return problems, used
}

// TestPrometheusRuleQueriesOnlyExportedMetrics: every alert queries metrics the relay exports, by
// labels they carry, and each alert asks what its name says.
func TestPrometheusRuleQueriesOnlyExportedMetrics(t *testing.T) {
	metrics := relayMetrics(t)
	rules := readRules(t)
	want := map[string][]string{ // each alert and the metrics it must read
		"RelayDetached":                   {"relay_upstream_attached", "relay_ha_leader"},
		"RelayEscrowReleasing":            {"relay_escrow_releases_total", "relay_upstream_attached"},
		"RelayPeerMemoryBudgetNearlyFull": {"relay_downstream_budget_used_bytes", "relay_downstream_budget_limit_bytes"},
		"RelayCertificateExpiring":        {certExpiryName},
		"RelayNoLeader":                   {"relay_ha_leader"},
		"RelayStandbyCopyIncomplete":      {"relay_ha_replication_complete", "relay_ha_leader"},
	}
	seen := map[string]bool{}
	for _, r := range rules {
		if seen[r.Alert] {
			t.Errorf("alert %s is defined twice", r.Alert)
		}
		seen[r.Alert] = true
		problems, used := queryProblems(metrics, r.Expr)
		for _, p := range problems {
			t.Errorf("alert %s (%s): %s", r.Alert, r.Expr, p)
		}
		needs, ok := want[r.Alert]
		if !ok {
			t.Errorf("alert %s is not one this test knows: add it here and to the README", r.Alert)
		}
		for _, m := range needs {
			if !slices.Contains(used, m) {
				t.Errorf("alert %s does not read %s: %s", r.Alert, m, r.Expr)
			}
		}
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			t.Errorf("alert %s has severity %q: want critical or warning", r.Alert, s)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("%s has no alert %s", ruleGolden, name)
		}
	}
}

// TestQueryProblemsFindsAnUnknownMetric: the check above can fail, on a name the relay does not
// export and a label none of its metrics has.
func TestQueryProblemsFindsAnUnknownMetric(t *testing.T) {
	metrics := relayMetrics(t)
	problems, _ := queryProblems(metrics, `relay_tls_certificate_expiry_seconds{job="x"} < 1`)
	problems2, _ := queryProblems(metrics, `sum by (reason) (relay_upstream_attached)`)
	if len(problems) != 1 || !strings.Contains(problems[0], "relay_tls_certificate_expiry_seconds") ||
		len(problems2) != 1 || !strings.Contains(problems2[0], "label reason") {
		t.Fatalf("problems %q and %q: want the unknown metric, then the unknown label", problems, problems2)
	}
}
