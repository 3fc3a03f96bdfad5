package ingress_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
)

func buckets(node string, days ...int) []contracts.ClusterTrafficStatistics {
	out := make([]contracts.ClusterTrafficStatistics, len(days))
	for i, d := range days {
		out[i] = contracts.ClusterTrafficStatistics{
			DayUTC: fmt.Sprintf("2024-05-%02d", d), NodeID: node, Hostname: "app.example.com",
			Requests: int64(100*d + i), BytesIn: 1 << 40, BytesOut: 9007199254740991, Connections: int64(d),
			Failures: contracts.TrafficFailures{Connect: 1, Handshake: 2, Request: 3},
		}
	}
	return out
}

type statsPage struct {
	raw        []json.RawMessage
	days       []string
	nextCursor string
}

// page asks the relay for one page as Cloudly.
func (h *harness) page(from, to, cursor string, limit int) (statsPage, error) {
	h.T.Helper()
	req := contracts.TrafficStatisticsRequest{FromDayUTC: from, ToDayUTC: to, Cursor: cursor, Limit: limit}
	resp, err := h.Cloudly.Call(h.ctx(), contracts.MethodGetClusterTrafficStatistics, req.Encode())
	if err != nil {
		return statsPage{}, err
	}
	p, err := contracts.ReadGetClusterTrafficStatisticsResponse(resp, req)
	if err != nil {
		h.T.Fatalf("the relay's page is not a page: %v: %s", err, resp)
	}
	var out statsPage
	for _, b := range p.Buckets {
		out.raw = append(out.raw, b.Raw)
		out.days = append(out.days, b.Day)
	}
	// Dated buckets in day order, then those without a readable day.
	dated := slices.IndexFunc(out.days, func(d string) bool { return d == "" })
	if dated < 0 {
		dated = len(out.days)
	}
	if !sort.StringsAreSorted(out.days[:dated]) || slices.ContainsFunc(out.days[dated:], func(d string) bool { return d != "" }) {
		h.T.Fatalf("page not merged in day order: %q", out.days)
	}
	out.nextCursor = p.NextCursor
	return out, nil
}

func encoded(bs []contracts.ClusterTrafficStatistics) map[string]bool {
	out := map[string]bool{}
	for _, b := range bs {
		raw, _ := json.Marshal(b)
		out[string(raw)] = true
	}
	return out
}

// TestStatisticsMergeTwoIngressesThreePages: getClusterTrafficStatistics fans out to both ingress
// connections, merges their day buckets, and pages with a cursor that resumes each ingress where
// it stopped; nodes and refused ingresses are never asked.
func TestStatisticsMergeTwoIngressesThreePages(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	a := h.accepted("node-a", "bearer-a")
	b := h.accepted("node-b", "bearer-b")
	node := h.node("node-c")
	refused := h.ingress("node-d", "wrong", false)
	if _, err := refused.Register(h.ctx()); err == nil {
		t.Fatal("an undesignated ingress was accepted")
	}
	aBuckets, bBuckets := buckets("node-a", 1, 2, 3, 4, 5), buckets("node-b", 1, 3, 5)
	a.SetStatistics(append(aBuckets, buckets("node-a", 31)[0], contracts.ClusterTrafficStatistics{
		DayUTC: "2024-06-01", NodeID: "node-a", Hostname: "late.example.com"})) // outside the requested days
	b.SetStatistics(bBuckets)
	want := encoded(append(append([]contracts.ClusterTrafficStatistics{}, aBuckets...), bBuckets...))
	want[func() string { r, _ := json.Marshal(buckets("node-a", 31)[0]); return string(r) }()] = true

	var pages []statsPage
	cursor := ""
	for {
		p, err := h.page("2024-05-01", "2024-05-31", cursor, 4)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.raw) > 4 {
			t.Fatalf("page %d holds %d buckets, limit 4", len(pages)+1, len(p.raw))
		}
		pages = append(pages, p)
		if cursor = p.nextCursor; cursor == "" || len(pages) > 5 {
			break
		}
	}
	if len(pages) != 3 {
		t.Fatalf("%d pages, want 3", len(pages))
	}
	wantDays := [][]string{
		{"2024-05-01", "2024-05-01", "2024-05-02", "2024-05-03"}, // a: 01 02, b: 01 03
		{"2024-05-03", "2024-05-04", "2024-05-05"},               // a: 03 04, b: 05 and done
		{"2024-05-05", "2024-05-31"},                             // a: all 4 of the limit, 05 31, done
	}
	got := map[string]bool{}
	for i, p := range pages {
		if fmt.Sprint(p.days) != fmt.Sprint(wantDays[i]) {
			t.Errorf("page %d days %v, want %v", i+1, p.days, wantDays[i])
		}
		for _, raw := range p.raw {
			if got[string(raw)] {
				t.Errorf("bucket answered twice: %s", raw)
			}
			got[string(raw)] = true
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d buckets answered, want %d", len(got), len(want))
	}
	for raw := range got {
		if !want[raw] {
			t.Fatalf("bucket not byte-identical to what an ingress served: %s", raw)
		}
	}
	if a.StatisticsRequests() != 3 || b.StatisticsRequests() != 2 {
		t.Fatalf("ingress a asked %d times, b %d: each must resume where it stopped and stop when done", a.StatisticsRequests(), b.StatisticsRequests())
	}
	if node.Received(contracts.MethodGetClusterTrafficStatistics) != 0 || refused.StatisticsRequests() != 0 {
		t.Fatal("a node or a refused ingress was asked for statistics")
	}
	if _, err := node.Call(h.ctx(), contracts.MethodGetClusterTrafficStatistics, json.RawMessage(`{"fromDayUtc":"2024-05-01","toDayUtc":"2024-05-31","limit":4}`)); !errors.Is(err, contracts.RelayIngressOnly) {
		t.Fatalf("a node asking for statistics: %v, want relay-ingress-only", err)
	}
}

// TestStatisticsIngressFailureIsReportedNotFatal: a failing ingress costs the page its buckets;
// the page answers with the others' and the cursor keeps the failing one's position, so the next
// page asks it again. One gone for good is given up after three pages in a row.
func TestStatisticsIngressFailureIsReportedNotFatal(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	a := h.accepted("node-a", "bearer-a")
	b := h.accepted("node-b", "bearer-b")
	a.SetStatistics(buckets("node-a", 1, 2, 3))
	b.SetStatistics(buckets("node-b", 1, 2))
	b.FailStatistics(contracts.RelayNodeBusy.Refuse("the proxy is reloading"))

	p, err := h.page("2024-05-01", "2024-05-31", "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.raw) != 3 || p.nextCursor == "" {
		t.Fatalf("page with b failing: %d buckets, nextCursor %q; want a's 3 and a cursor", len(p.raw), p.nextCursor)
	}
	if h.Metric("relay_ingress_statistics_ingress_failures_total", "reason", "refused") != 1 {
		t.Fatal("the failure was not counted")
	}
	b.FailStatistics(nil)
	p, err = h.page("2024-05-01", "2024-05-31", p.nextCursor, 10)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(p.days) != "[2024-05-01 2024-05-02]" || p.nextCursor != "" {
		t.Fatalf("retry page: %v %q; want b's two buckets from its start and no cursor", p.days, p.nextCursor)
	}
	if a.StatisticsRequests() != 1 {
		t.Fatal("a finished ingress was asked again")
	}

	// Gone for good: three pages in a row, then the cursor stops asking.
	a.SetStatistics(buckets("node-a", 1, 2, 3, 4, 5, 6))
	p, err = h.page("2024-05-01", "2024-05-31", "", 2)
	if err != nil || len(p.raw) != 2 {
		t.Fatalf("first page: %v %v", p.days, err)
	}
	b.Close()
	h.Eventually("b's connection is gone", func() bool { return h.Metric("relay_ingress_connections") == 1 })
	pages := 1
	for p.nextCursor != "" && pages < 10 {
		if p, err = h.page("2024-05-01", "2024-05-31", p.nextCursor, 2); err != nil {
			t.Fatal(err)
		}
		pages++
	}
	if pages != 4 {
		t.Fatalf("%d pages until the end, want 4 (a has 6 buckets, 2 per page; b given up on the third)", pages)
	}
	if h.Metric("relay_ingress_statistics_ingress_failures_total", "reason", "gone") != 3 || h.Metric("relay_ingress_statistics_ingresses_given_up_total") != 1 {
		t.Fatal("gone failures and the give-up were not counted")
	}
}

// TestStatisticsRequestsTheRelayCannotRead are refused relay-request-invalid, by name.
func TestStatisticsRequestsTheRelayCannotRead(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	a := h.accepted("node-a", "bearer-a")
	a.SetStatistics(buckets("node-a", 1, 2, 3))
	p, err := h.page("2024-05-01", "2024-05-31", "", 1)
	if err != nil || p.nextCursor == "" {
		t.Fatalf("first page: %v", err)
	}
	for _, c := range []struct{ from, to, cursor string }{
		{"2024-05-01", "2024-05-30", p.nextCursor},                             // another range
		{"2024-05-01", "2024-05-31", p.nextCursor[:len(p.nextCursor)-2] + "x"}, // tampered
		{"2024-05-01", "2024-05-31", "o1"},                                     // an ingress's cursor, not the relay's
	} {
		if _, err := h.page(c.from, c.to, c.cursor, 1); !errors.Is(err, contracts.RelayRequestInvalid) {
			t.Errorf("cursor %q for %s..%s: %v", c.cursor, c.from, c.to, err)
		}
	}
	for _, body := range []string{
		`{"fromDayUtc":"2024-05-01","toDayUtc":"2024-05-31","limit":0}`,
		`{"fromDayUtc":"2024-5-1","toDayUtc":"2024-05-01","limit":1}`,
	} {
		if _, err := h.Cloudly.Call(h.ctx(), contracts.MethodGetClusterTrafficStatistics, json.RawMessage(body)); !errors.Is(err, contracts.RelayRequestInvalid) {
			t.Errorf("%s: %v", body, err)
		}
	}
}

// TestStatisticsRequestsTheSeedsLeaveOpen are served: the seeds bound neither limit nor the order
// of the days. A limit above 1 000 is a page of at most 1 000 buckets with its nextCursor; days in
// reverse name none, answered with no bucket and no ingress asked.
func TestStatisticsRequestsTheSeedsLeaveOpen(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	a := h.accepted("node-a", "bearer-a")
	a.SetStatistics(buckets("node-a", 1, 2, 3))
	resp, err := h.Cloudly.Call(h.ctx(), contracts.MethodGetClusterTrafficStatistics, json.RawMessage(`{"fromDayUtc":"2024-05-01","toDayUtc":"2024-05-31","limit":100000}`))
	if err != nil || strings.Count(string(resp), `"dayUtc"`) != 3 {
		t.Fatalf("limit 100 000: %s %v", resp, err)
	}
	if got := a.StatisticsRequests(); got != 1 {
		t.Fatalf("the ingress was asked %d times", got)
	}
	resp, err = h.Cloudly.Call(h.ctx(), contracts.MethodGetClusterTrafficStatistics, json.RawMessage(`{"fromDayUtc":"2024-05-31","toDayUtc":"2024-05-01","limit":1}`))
	if err != nil || string(resp) != `{"statistics":[]}` || a.StatisticsRequests() != 1 {
		t.Fatalf("days in reverse: %s %v, the ingress asked %d times", resp, err, a.StatisticsRequests())
	}
}

// TestStatisticsWithNoIngressIsAnEmptyLastPage.
func TestStatisticsWithNoIngressIsAnEmptyLastPage(t *testing.T) {
	h := newHarness(t, harnessOptions{statisticsTimeout: time.Second})
	resp, err := h.Cloudly.Call(h.ctx(), contracts.MethodGetClusterTrafficStatistics, json.RawMessage(`{"fromDayUtc":"2024-05-01","toDayUtc":"2024-05-31","limit":5}`))
	if err != nil || string(resp) != `{"statistics":[]}` {
		t.Fatalf("%s %v", resp, err)
	}
}
