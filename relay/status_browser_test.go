package relay_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/relay"
)

// TestStatusPageInABrowser loads /status in a real headless Chromium while the relay carries
// nodes, and reads the attached state and the node count from the page it rendered; then, with
// Cloudly refusing the registration, the detach reason naming the refusal. CI installs Chromium
// (RELAY_REQUIRE_BROWSER=1 there); elsewhere the test skips without it, naming the command that
// installs it.
func TestStatusPageInABrowser(t *testing.T) {
	t.Parallel() // most of its time is Chromium starting, a process of its own: other tests run beside it
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
	// Formatted for people: durations in units, times as how long ago and when, sizes with
	// units, no timestamp as encoding/json writes it and no camelCase label.
	for what, re := range map[string]string{
		"uptime":             `id="uptime">(\d+(ms|s)|\d+m\d\ds)<`,
		"attached since":     `id="cloudly-since">(now|\d+(ms|s) ago|\d+m\d\ds ago) \(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)<`,
		"budget":             `id="budget">[0-9.]+ (B|KiB|MiB) of 256.0 MiB`,
		"a node's connected": `<td>node-\d</td><td>(now|\d+(ms|s) ago)</td>`,
	} {
		if !regexp.MustCompile(re).MatchString(dom) {
			t.Errorf("the browser rendered no %s for people (%s)", what, re)
		}
	}
	if m := notForPeople.FindString(dom); m != "" {
		t.Errorf("the browser rendered %q: a raw timestamp or a camelCase label", m)
	}

	e.cloudly.SetRegistrationRefusal(contracts.RelayNodeForeign.Refuse("node relay-node is not in cluster-sim"))
	e.cloudly.Drop()
	e.eventually("the refusal on the status page", func() bool {
		_, page := e.admin("/status")
		return strings.Contains(page, "registration refused relay-node-foreign")
	})
	dom = headless(t, browser, "--dump-dom", "http://"+e.relay.AdminAddr().String()+"/status")
	attached = regexp.MustCompile(`id="attached">([a-z]+)<`).FindStringSubmatch(dom)
	reason := regexp.MustCompile(`id="detach-reason"[^>]*>([^<]+)<`).FindStringSubmatch(dom)
	if attached == nil || attached[1] != "detached" || reason == nil || !strings.HasPrefix(reason[1], "registration refused relay-node-foreign: ") {
		t.Fatalf("the browser rendered attached=%v reason=%v while Cloudly refuses the registration:\n%s", attached, reason, dom)
	}
}

// notForPeople finds what a person should never read on the status page: a timestamp as
// encoding/json writes it, and a camelCase key as a label.
var notForPeople = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d|<th>[a-z]+[A-Z][A-Za-z]*</th>`)

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
