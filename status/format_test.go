package status

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", 250 * time.Millisecond: "250ms", 45 * time.Second: "45s", 192 * time.Second: "3m12s",
		65 * time.Minute: "1h05m", 26*time.Hour + 30*time.Minute: "26h30m", 76 * time.Hour: "3d04h", -4 * time.Second: "4s",
	} {
		if got := Duration(d); got != want {
			t.Errorf("Duration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestRelativeAndAt(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	if got := Relative(now, now.Add(-192*time.Second)); got != "3m12s ago" {
		t.Errorf("Relative, past: %q", got)
	}
	if got := Relative(now, now.Add(4*time.Second)); got != "in 4s" {
		t.Errorf("Relative, future: %q", got)
	}
	if got := Relative(now, now.Add(870*time.Millisecond)); got != "in 870ms" {
		t.Errorf("Relative, within a second: %q", got)
	}
	if got := Relative(now, now.Add(-5*time.Millisecond)); got != "now" {
		t.Errorf("Relative, within 10 ms: %q", got)
	}
	if got := At(now, now.Add(-time.Minute)); got != "1m00s ago (2026-12-01 09:59:00 UTC)" {
		t.Errorf("At: %q", got)
	}
	if got := At(now, time.Time{}); got != "—" {
		t.Errorf("At, zero: %q", got)
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 512: "512 B", 16 << 10: "16.0 KiB", 3 << 19: "1.5 MiB", 10 << 30: "10.0 GiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestLabel(t *testing.T) {
	for key, want := range map[string]string{
		"renewals": "renewals", "releasesWhileDetached": "releases while detached", "nodeId": "node id",
		"quicPort": "quic port", "lastURL": "last URL", "URLPath": "URL path", "closuresInflight": "closures inflight",
		"v2": "v2",
	} {
		if got := Label(key); got != want {
			t.Errorf("Label(%q) = %q, want %q", key, got, want)
		}
	}
}

// TestRenderJSON: a part's facts read for people — keys in words, times relative, sizes with
// units, booleans as yes or no, null as a dash — and everything escaped.
func TestRenderJSON(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	got := string(renderJSON(now, []byte(`{"releasing":true,"nextRelease":"2026-12-01T10:00:04.123456789Z","limitBytes":1048576,`+
		`"idleSeconds":90,"waitMs":1500,"pausedUntil":null,"note":"<b>","nodes":[{"node":"node-a","heldUntil":"2026-12-01T09:57:00Z"}]}`)))
	for _, want := range []string{
		"<th>releasing</th><td>yes</td>", "<th>next release</th><td>in 4s (2026-12-01 10:00:04 UTC)</td>",
		"<th>limit bytes</th><td>1.0 MiB</td>", "<th>idle seconds</th><td>1m30s</td>", "<th>wait ms</th><td>1s</td>",
		"<th>paused until</th><td>—</td>", "<td>&lt;b&gt;</td>", "<th>held until</th>", "<td>3m00s ago (2026-12-01 09:57:00 UTC)</td>",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rendered facts lack %q:\n%s", want, got)
		}
	}
}

// notForPeople finds what a person should never read on the page: a timestamp as encoding/json
// writes it, and a camelCase key as a label.
var notForPeople = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d|<th>[a-z]+[A-Z][A-Za-z]*</th>`)

// fixedSource is a Source that answers one snapshot.
type fixedSource struct{ st Snapshot }

func (f fixedSource) Snapshot(time.Time) Snapshot { return f.st }
func (f fixedSource) Ready() (string, error)      { return "ready", nil }

func render(t *testing.T, st Snapshot) string {
	t.Helper()
	var buf bytes.Buffer
	if err := statusPage.Execute(&buf, newPage(st)); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// TestPageForAStandby: a healthy standby — detached on purpose, the escrow releasing nothing of
// its own — is shown in the standby's colour, never as a failure; the same facts on a single
// relay are a failure, painted so.
func TestPageForAStandby(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	st := Snapshot{Now: now, Ready: "ready", Role: RoleStandby, Started: now.Add(-3 * time.Hour), UptimeSeconds: 3 * 3600,
		Cloudly: Cloudly{Since: now.Add(-time.Hour), Reason: "standing by: only the elected relay dials Cloudly", Custody: "held"},
		HA:      map[string]any{"role": "standby", "holder": "pod-a", "since": now.Add(-time.Hour)},
		Parts:   []Part{{Name: "escrow", Ready: "ready", Status: map[string]any{"releasing": true, "runs": 3}}}}
	page := render(t, st)
	if strings.Contains(page, `class="bad"`) {
		t.Fatalf("a healthy standby is painted as failing:\n%s", page)
	}
	for _, want := range []string{`<b class="idle" id="attached">detached</b>`, `id="detach-reason" class="idle">standing by`,
		`<h2>ha <small class="ok">standby</small></h2>`, `<th>releasing</th><td>yes</td>`, `<span id="uptime">3h00m</span>`,
		`<td id="cloudly-since">1h00m ago (2026-12-01 09:00:00 UTC)</td>`} {
		if !strings.Contains(page, want) {
			t.Errorf("the standby's page lacks %q", want)
		}
	}
	if m := notForPeople.FindString(page); m != "" {
		t.Errorf("the page shows %q", m)
	}

	st.Role, st.HA = RoleSingle, nil
	if page := render(t, st); !strings.Contains(page, `<b class="bad" id="attached">detached</b>`) {
		t.Fatal("a detached single relay is not painted as failing: the standby check above proves nothing")
	}
}

// TestPageAddresses: the hub is shown where it is bound and as it is reported, never as the
// listen flag's port 0; sizes carry units.
func TestPageAddresses(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	st := Snapshot{Now: now, Ready: "ready", Role: RoleSingle, Cloudly: Cloudly{Attached: true, Since: now},
		Addresses:  Addresses{HubListen: "127.0.0.1:0", HubBound: "127.0.0.1:41641", Hub: "192.0.2.1:41641"},
		Downstream: Downstream{BudgetUsedBytes: 3 << 19, BudgetLimitBytes: 256 << 20},
		Nodes:      Nodes{Count: 1, Busiest: []Node{{Node: "node-a", ConnectedSince: now.Add(-90 * time.Second), HeldBytes: 2048}}}}
	page := render(t, st)
	for _, want := range []string{`<td id="hub">bound to 127.0.0.1:41641, reported to Cloudly as 192.0.2.1:41641</td>`,
		`<td id="budget">1.5 MiB of 256.0 MiB (0 evictions)</td>`, "<td>1m30s ago</td>", "<td>2.0 KiB</td>"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(page, "127.0.0.1:0") {
		t.Error("the page shows the hub as bound to port 0")
	}
}

// TestCounterUnits: a counter of bytes reads with units, total and rate; any other as a number.
func TestCounterUnits(t *testing.T) {
	rate := 3.0 * (1 << 19)
	if got := num("relay_x_sent_bytes_total", 1<<20) + " " + perMinute("relay_x_sent_bytes_total", &rate); got != "1.0 MiB 1.5 MiB/min" {
		t.Errorf("bytes: %q", got)
	}
	if got := num("relay_x_total", 1<<20) + " " + perMinute("relay_x_total", &rate); got != "1048576 1572864.0/min" {
		t.Errorf("a count: %q", got)
	}
}

// TestServerSnapshot: the server adds its own facts to the Source's: the uptime from its start
// and the counters.
func TestServerSnapshot(t *testing.T) {
	s := New(Config{Source: fixedSource{Snapshot{Role: RoleSingle}}})
	st := s.snapshot()
	if st.Started.IsZero() || st.Now.Before(st.Started) || st.Counters == nil {
		t.Fatalf("snapshot: started %v now %v counters %v", st.Started, st.Now, st.Counters)
	}
}
