package vpnhub

import (
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestMetricNames(t *testing.T) {
	want := map[string]dto.MetricType{
		"relay_vpnhub_members": dto.MetricType_GAUGE, "relay_vpnhub_sessions": dto.MetricType_GAUGE,
		"relay_vpnhub_membership_generation": dto.MetricType_GAUGE,
		"relay_vpnhub_handshakes_total":      dto.MetricType_COUNTER, "relay_vpnhub_forwarded_packets_total": dto.MetricType_COUNTER,
		"relay_vpnhub_forwarded_bytes_total": dto.MetricType_COUNTER, "relay_vpnhub_dropped_packets_total": dto.MetricType_COUNTER,
		"relay_vpnhub_session_closes_total": dto.MetricType_COUNTER, "relay_vpnhub_keepalives_total": dto.MetricType_COUNTER,
	}
	reg := prometheus.NewRegistry()
	if err := newMetrics().register(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]bool{}
	for _, mf := range mfs {
		typ, ok := want[mf.GetName()]
		switch {
		case !ok:
			t.Errorf("unexpected metric %q", mf.GetName())
		case typ != mf.GetType():
			t.Errorf("%s is a %v", mf.GetName(), mf.GetType())
		case typ == dto.MetricType_COUNTER && !strings.HasSuffix(mf.GetName(), "_total"):
			t.Errorf("counter %s does not end in _total", mf.GetName())
		}
		delete(want, mf.GetName())
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[mf.GetName()+"{"+l.GetName()+"="+l.GetValue()+"}"] = true
			}
		}
	}
	for n := range want {
		t.Errorf("metric %q missing", n)
	}
	kebab := regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)
	for l := range labels {
		if v := l[strings.Index(l, "=")+1 : len(l)-1]; !kebab.MatchString(v) {
			t.Errorf("label value %q is not kebab-case: %s", v, l)
		}
	}
	for _, r := range []string{"spoofed", "replayed", "unknown-destination", "not-unicast", "queue-full", "too-large", "expired", "malformed", "unauthenticated"} {
		if !labels["relay_vpnhub_dropped_packets_total{reason="+r+"}"] {
			t.Errorf("drop reason %q missing", r)
		}
	}
	for _, o := range []string{"accepted", "rate-limited", "broken", "vpn-member-unknown", "vpn-member-expired", "vpn-member-node-mismatch",
		"vpn-authority-mismatch", "vpn-member-removed", "vpn-handshake-replayed"} {
		if !labels["relay_vpnhub_handshakes_total{outcome="+o+"}"] {
			t.Errorf("handshake outcome %q missing", o)
		}
	}
	for _, r := range []string{"vpn-member-removed", "vpn-member-replaced", "vpn-member-expired", "vpn-authority-mismatch", "vpn-session-silent", "left", "shutdown"} {
		if !labels["relay_vpnhub_session_closes_total{reason="+r+"}"] {
			t.Errorf("close reason %q missing", r)
		}
	}
}
