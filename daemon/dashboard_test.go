package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/relay"
)

// The chart's Grafana dashboard queries only what the relay exports. Its relay_* names and labels
// are judged against docs/operating.md's metric table (itself checked against the relay's registry
// by TestOperatingDocListsEveryMetric), its go_* and process_* names against the collectors
// relay.NewRegistry registers.

const dashboardPath = "../charts/relay/dashboards/relay.json"

// targetLabels are the labels Prometheus Operator gives every series the chart's ServiceMonitor
// scrapes; the dashboard's variables select on namespace, job and pod.
var targetLabels = []string{"namespace", "job", "pod", "instance", "service", "endpoint", "container"}

// operatorFirst are the metrics an operator needs first: the dashboard must show each.
var operatorFirst = []string{
	"relay_upstream_attached", "relay_upstream_attaches_total", "relay_upstream_detaches_total",
	"relay_downstream_nodes", "relay_downstream_connections",
	"relay_downstream_forwarded_requests_total", "relay_downstream_refusals_total",
	"relay_upstream_queued_frames", "relay_downstream_queued_frames",
	"relay_downstream_budget_used_bytes", "relay_downstream_budget_limit_bytes",
	"relay_downstream_budget_evictions_total", "relay_downstream_budget_refusals_total",
	"relay_downstream_streams", "relay_escrow_runs_held", "relay_escrow_releases_total",
	"relay_vpnhub_members", "relay_vpnhub_sessions", "relay_vpnhub_forwarded_packets_total",
	"relay_vpnhub_dropped_packets_total", "relay_ingress_route_table_revision",
	"relay_registry_cache_bytes", "relay_registry_cache_hits_total", "relay_registry_cache_misses_total",
	"relay_restore_inflight", "process_resident_memory_bytes", "go_goroutines",
}

var (
	docRow       = regexp.MustCompile("^\\| `(relay_[a-z0-9_]+)` \\| ([^|]*) \\|")
	metricName   = regexp.MustCompile(`\b((?:relay|go|process)_[a-z0-9_]+)\b(\{[^}]*\})?`)
	groupingList = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	matcherLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	legendLabel  = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	labelValues  = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)
)

// exportedMetrics maps every metric name the relay exports to its labels: relay_* from
// docs/operating.md's table, go_* and process_* from the collectors of relay.NewRegistry.
func exportedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	doc, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "<!-- metrics: generated and checked by daemon TestOperatingDocListsEveryMetric -->")
	if !ok {
		t.Fatal("docs/operating.md lacks the metrics marker")
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
		t.Fatalf("read only %d metrics from docs/operating.md's table", len(metrics))
	}
	families, err := relay.NewRegistry().Gather()
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
	return metrics
}

// lookup finds a queried name: a metric as exported, or a histogram's or summary's series.
func lookup(metrics map[string][]string, name string) (labels []string, ok bool) {
	if labels, ok = metrics[name]; ok {
		return labels, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, cut := strings.CutSuffix(name, suffix); cut && !strings.HasSuffix(base, "_total") {
			if labels, ok = metrics[base]; ok {
				if suffix == "_bucket" {
					labels = append(slices.Clone(labels), "le")
				}
				return labels, true
			}
		}
	}
	return nil, false
}

// checkQuery reports the names a PromQL query uses that the relay does not export, and the
// labels it groups, matches or names in its legend that none of its metrics carry.
func checkQuery(metrics map[string][]string, expr, legend string) (problems []string, used []string) {
	allowed := slices.Clone(targetLabels)
	for _, m := range metricName.FindAllStringSubmatch(expr, -1) {
		labels, ok := lookup(metrics, m[1])
		if !ok {
			problems = append(problems, fmt.Sprintf("metric %s is neither in docs/operating.md's table nor a Go or process collector's", m[1]))
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
	for _, m := range metricName.FindAllStringSubmatch(expr, -1) {
		for _, l := range matcherLabel.FindAllStringSubmatch(m[2], -1) {
			named = append(named, l[1])
		}
	}
	for _, l := range legendLabel.FindAllStringSubmatch(legend, -1) {
		named = append(named, l[1])
	}
	for _, l := range named {
		if !slices.Contains(allowed, l) {
			problems = append(problems, fmt.Sprintf("label %q is on none of its metrics", l))
		}
	}
	return problems, used
}

type dashboardPanel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	GridPos    struct{ H, W, X, Y int }
	Panels     []dashboardPanel `json:"panels"`
	Targets    []struct {
		Expr         string          `json:"expr"`
		LegendFormat string          `json:"legendFormat"`
		RefID        string          `json:"refId"`
		Datasource   json.RawMessage `json:"datasource"`
	} `json:"targets"`
}

type dashboard struct {
	UID           string           `json:"uid"`
	Title         string           `json:"title"`
	SchemaVersion int              `json:"schemaVersion"`
	Panels        []dashboardPanel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource json.RawMessage `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

func TestDashboardQueriesOnlyExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	metrics := exportedMetrics(t)

	// Grafana 12 and later read schema 41 and up without migrating it; uid keeps links stable.
	if d.SchemaVersion < 41 || d.UID == "" || d.Title == "" {
		t.Errorf("schemaVersion %d, uid %q, title %q: want 41 or later and both set", d.SchemaVersion, d.UID, d.Title)
	}

	// The data source is a variable of Prometheus data sources, and every query uses it; namespace,
	// job and pod are variables over label values.
	wantDS := `{"type":"prometheus","uid":"${datasource}"}`
	sameDS := func(raw json.RawMessage) bool {
		var compact bytes.Buffer
		return json.Compact(&compact, raw) == nil && compact.String() == wantDS
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		var query string
		if json.Unmarshal(v.Query, &query) != nil {
			var q struct{ Query string }
			json.Unmarshal(v.Query, &q)
			query = q.Query
		}
		switch v.Type {
		case "datasource":
			if v.Name != "datasource" || query != "prometheus" {
				t.Errorf("data source variable %q queries %q: want datasource, prometheus", v.Name, query)
			}
		case "query":
			if !sameDS(v.Datasource) {
				t.Errorf("variable %s: datasource %s, want %s", v.Name, bytes.Join(bytes.Fields(v.Datasource), nil), wantDS)
			}
			m := labelValues.FindStringSubmatch(query)
			if m == nil {
				t.Errorf("variable %s: query %q is not label_values(metric, label)", v.Name, query)
				continue
			}
			problems, _ := checkQuery(metrics, m[1]+" by ("+m[2]+")", "")
			for _, p := range problems {
				t.Errorf("variable %s: %s", v.Name, p)
			}
		}
	}
	for name, typ := range map[string]string{"datasource": "datasource", "namespace": "query", "job": "query", "pod": "query"} {
		if vars[name] != typ {
			t.Errorf("variable %s is %q, want a %s variable", name, vars[name], typ)
		}
	}

	var panels []dashboardPanel
	for i, p := range d.Panels {
		panels = append(panels, p)
		panels = append(panels, p.Panels...) // a collapsed row holds its panels
		g := p.GridPos
		for _, q := range d.Panels[:i] {
			if h := q.GridPos; g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
				t.Errorf("panel %d %q overlaps panel %d %q", p.ID, p.Title, q.ID, q.Title)
			}
		}
	}
	ids := map[int]bool{}
	shown := map[string]bool{}
	for _, p := range panels {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if ids[p.ID] {
			t.Errorf("%s: id used twice", where)
		}
		ids[p.ID] = true
		if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v is outside the 24 columns", where, g)
		}
		if p.Type == "row" {
			continue
		}
		if !sameDS(p.Datasource) {
			t.Errorf("%s: datasource %s, want %s", where, bytes.Join(bytes.Fields(p.Datasource), nil), wantDS)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no queries", where)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if refs[q.RefID] || q.RefID == "" {
				t.Errorf("%s: refId %q empty or used twice", where, q.RefID)
			}
			refs[q.RefID] = true
			if q.Datasource != nil && !sameDS(q.Datasource) {
				t.Errorf("%s: query %s has datasource %s, want %s", where, q.RefID, bytes.Join(bytes.Fields(q.Datasource), nil), wantDS)
			}
			problems, used := checkQuery(metrics, q.Expr, q.LegendFormat)
			if len(used) == 0 {
				problems = append(problems, "queries none of the relay's metrics")
			}
			for _, m := range metricName.FindAllStringSubmatch(q.Expr, -1) {
				for _, sel := range []string{`namespace=~"$namespace"`, `job=~"$job"`, `pod=~"$pod"`} {
					if !strings.Contains(m[2], sel) {
						problems = append(problems, fmt.Sprintf("%s is not selected by %s", m[1], sel))
					}
				}
			}
			for _, p := range problems {
				t.Errorf("%s, query %s (%s): %s", where, q.RefID, q.Expr, p)
			}
			for _, m := range used {
				shown[strings.TrimSuffix(m, "_bucket")] = true
			}
		}
	}
	for _, m := range operatorFirst {
		if !shown[m] {
			t.Errorf("the dashboard shows no panel of %s", m)
		}
	}
}
