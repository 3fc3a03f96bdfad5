package relay_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/status"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
)

// TestStatusPage: /status.json and /status show what the relay carries, the busiest nodes first,
// and never a secret.
func TestStatusPage(t *testing.T) {
	e := start(t, relay.Features{})
	quiet, busy := e.node("node-quiet"), e.node("node-busy")
	for i := range 5 {
		if _, err := busy.Report(ctxHung(t), "reportRuntimeAssignmentObservation", map[string]any{"i": i}); err != nil {
			t.Fatal(err)
		}
	}
	quiet.Report(ctxHung(t), "reportRuntimeAssignmentObservation", nil)

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
	e.node("node-a").Report(ctxHung(t), "reportRuntimeAssignmentObservation", nil)
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

func statusGet(t *testing.T, e *relaytest.Env, path string) (int, string) {
	t.Helper()
	x := &env{Env: e, t: t, relay: e.Relay}
	return x.admin(path)
}

// TestStatusPageReadsTheRelaysClock: every time the relay shows is read on its clock
// (Options.Now): the page's now, when Cloudly attached, when a node connected.
func TestStatusPageReadsTheRelaysClock(t *testing.T) {
	at := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	e := relaytest.Start(t, relaytest.Options{Build: func(cfg relay.Config, o relay.Options) (*relay.Relay, error) {
		o.Now = func() time.Time { return at }
		return relay.New(cfg, relay.Features{}, o)
	}})
	e.Node("node-a")
	_, body := statusGet(t, e, "/status.json")
	var st status.Snapshot
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if !st.Now.Equal(at) || !st.Started.Equal(at) || !st.Cloudly.Since.Equal(at) || len(st.Nodes.Busiest) != 1 ||
		!st.Nodes.Busiest[0].ConnectedSince.Equal(at) {
		t.Fatalf("now %v, started %v, attached since %v, nodes %+v: want each %v", st.Now, st.Started, st.Cloudly.Since, st.Nodes.Busiest, at)
	}
	if _, page := statusGet(t, e, "/status"); !strings.Contains(page, `<td id="cloudly-since">now (2031-05-06 07:08:09 UTC)</td>`) {
		t.Fatal("the page does not show the attach on the relay's clock")
	}
}
