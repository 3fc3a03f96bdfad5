package relay_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/relay"
)

var metricName = regexp.MustCompile(`^relay_((upstream|downstream)_[a-z_]+|build_info)$`)

var wantMetrics = []string{
	"relay_upstream_attached", "relay_upstream_attaches_total", "relay_upstream_detaches_total",
	"relay_upstream_registrations_total", "relay_upstream_queued_frames", "relay_downstream_connections",
	"relay_downstream_nodes", "relay_downstream_registrations_total", "relay_downstream_queued_frames",
	"relay_downstream_forwarded_requests_total", "relay_downstream_refusals_total", "relay_build_info",
}

// TestMetricNames: namespace relay, subsystems upstream and downstream, counters end in _total and
// nothing else does, and the core's metrics are all there.
func TestMetricNames(t *testing.T) {
	e := start(t, relay.Features{})
	n := e.node("node-a")
	n.Report(ctxHung(t), "reportRuntimeAssignmentObservation", nil)
	n.Call(ctxHung(t), "openRuntimeAssignmentExec", json.RawMessage(`{}`))
	families, err := e.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range families {
		name := f.GetName()
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		seen[name] = true
		if !metricName.MatchString(name) {
			t.Errorf("metric %s is not relay_<subsystem>_<name>", name)
		}
		if f.GetType().String() == "COUNTER" && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s does not end in _total", name)
		}
		if f.GetType().String() != "COUNTER" && strings.HasSuffix(name, "_total") {
			t.Errorf("%s ends in _total but is a %s", name, f.GetType())
		}
	}
	for _, want := range wantMetrics {
		if !seen[want] {
			t.Errorf("metric %s missing", want)
		}
	}
}
