package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/relay"
)

// TestStatusPage: /status.json and /status show what the relay carries, the busiest nodes first,
// and never a secret.
func TestStatusPage(t *testing.T) {
	e := start(t, relay.Features{})
	quiet, busy := e.node("node-quiet"), e.node("node-busy")
	for i := range 5 {
		if _, err := busy.Report(ctx5(t), "reportRuntimeAssignmentObservation", map[string]any{"i": i}); err != nil {
			t.Fatal(err)
		}
	}
	quiet.Report(ctx5(t), "reportRuntimeAssignmentObservation", nil)

	code, body := e.admin("/status.json")
	if code != 200 {
		t.Fatalf("/status.json: %d", code)
	}
	var st relay.Status
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
	var st relay.Status
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

// TestStatusPageInABrowser loads /status in a real headless Chromium while the relay carries
// nodes, and reads the attached state and the node count from the page it rendered. CI installs
// Chromium (RELAY_REQUIRE_BROWSER=1 there); elsewhere the test skips without it.
func TestStatusPageInABrowser(t *testing.T) {
	browser, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("RELAY_REQUIRE_BROWSER") == "1" {
			t.Fatal("chromium not found (RELAY_REQUIRE_BROWSER=1: apt-get install chromium)")
		}
		t.Skip("chromium not found: apt-get install chromium")
	}
	e := start(t, relay.Features{})
	for i := range 3 {
		e.node(fmt.Sprintf("node-%d", i))
	}
	dom := headless(t, browser, "--dump-dom", "http://"+e.relay.AdminAddr().String()+"/status")
	attached := regexp.MustCompile(`id="attached">([a-z]+)<`).FindStringSubmatch(dom)
	nodes := regexp.MustCompile(`id="nodes">(\d+)<`).FindStringSubmatch(dom)
	if attached == nil || attached[1] != "attached" || nodes == nil || nodes[1] != "3" {
		t.Fatalf("the browser rendered attached=%v nodes=%v:\n%s", attached, nodes, dom)
	}
}

// headless runs Chromium headless with the flags a closed network needs and returns its output.
func headless(t *testing.T, browser string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, append([]string{"--headless", "--no-sandbox", "--disable-gpu",
		"--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update",
		"--disable-sync", "--user-data-dir=" + filepath.Join(t.TempDir(), "profile")}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	return string(out)
}
