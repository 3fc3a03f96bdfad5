package ingress

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/testenv/await"
)

// Small fakes of the two ports, for what a real relay cannot stage on demand: an answer that
// never comes, a connection that ends while Cloudly judges it.

type fakePeer struct {
	id uint64
	mu sync.Mutex
	// answer serves a call; nil leaves it unanswered (done kept in pending).
	answer  func(method string, body json.RawMessage) (json.RawMessage, error)
	pending []func(json.RawMessage, error)
}

func (p *fakePeer) ID() uint64 { return p.id }

func (p *fakePeer) Call(method string, body json.RawMessage, done func(json.RawMessage, error)) {
	if p.answer == nil {
		p.mu.Lock()
		p.pending = append(p.pending, done)
		p.mu.Unlock()
		return
	}
	go done(p.answer(method, body))
}

type fakeUpstream struct {
	mu    sync.Mutex
	calls map[string][]func(json.RawMessage, error)
}

func (u *fakeUpstream) Attached() bool { return true }

func (u *fakeUpstream) Call(method string, _ json.RawMessage, done func(json.RawMessage, error)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.calls == nil {
		u.calls = map[string][]func(json.RawMessage, error){}
	}
	u.calls[method] = append(u.calls[method], done)
}

func (u *fakeUpstream) take(method string) func(json.RawMessage, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	d := u.calls[method][0]
	u.calls[method] = u.calls[method][1:]
	return d
}

func newTestServer(t *testing.T, timeout time.Duration) *Server {
	t.Helper()
	s, err := New(Options{Logger: zerolog.Nop(), Registerer: prometheus.NewRegistry(), StatisticsTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// counterValue reads a counter's value through a registry of its own.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil || len(families) != 1 {
		t.Fatalf("gather: %v", err)
	}
	return families[0].GetMetric()[0].GetCounter().GetValue()
}

func registration(node string) json.RawMessage {
	return contracts.EncodeClusterIngressRegistration(contracts.ClusterIngressRegistration{
		Bearer: contracts.NewSecret("b"), Version: "3.0.0", NodeID: node, Protocol: contracts.RelayOffer})
}

// TestConnectionEndingWhileCloudlyJudgesIsNeverAnIngress: an acceptance that arrives after
// PeerGone does not resurrect the connection (nor leak it in the tables).
func TestConnectionEndingWhileCloudlyJudgesIsNeverAnIngress(t *testing.T) {
	s := newTestServer(t, 0)
	up := &fakeUpstream{}
	s.Attached(up)
	p := &fakePeer{id: 7}
	replied := make(chan error, 1)
	s.Register(p, registration("node-a"), func(_ json.RawMessage, err error) { replied <- err })
	s.PeerGone(p)
	up.take(contracts.MethodRegisterClusterIngress)(json.RawMessage(`{"accepted":true,"revision":null,"protocol":{}}`), nil)
	<-replied
	if s.IsIngress(p) || len(s.connections()) != 0 || len(s.pending) != 0 {
		t.Fatal("a gone connection became an ingress")
	}
}

// TestAnswerThatIsNoAcceptanceIsRefused: the relay cannot tell an ingress it is accepted when
// Cloudly did not say so.
func TestAnswerThatIsNoAcceptanceIsRefused(t *testing.T) {
	s := newTestServer(t, 0)
	up := &fakeUpstream{}
	s.Attached(up)
	p := &fakePeer{id: 1}
	replied := make(chan error, 1)
	s.Register(p, registration("node-a"), func(_ json.RawMessage, err error) { replied <- err })
	up.take(contracts.MethodRegisterClusterIngress)(json.RawMessage(`{"accepted":false}`), nil)
	if err := <-replied; !errors.Is(err, contracts.RelayRequestInvalid) || s.IsIngress(p) {
		t.Fatalf("%v", err)
	}
	// Before any attach there is no Cloudly session to forward to.
	s2 := newTestServer(t, 0)
	s2.Register(p, registration("node-a"), func(_ json.RawMessage, err error) { replied <- err })
	if err := <-replied; !errors.Is(err, contracts.RelayUpstreamDetached) {
		t.Fatalf("before attach: %v", err)
	}
}

// accept makes p an ingress of node through a fake Cloudly acceptance.
func accept(t *testing.T, s *Server, up *fakeUpstream, p feature.Peer, node string) {
	t.Helper()
	done := make(chan struct{})
	s.Register(p, registration(node), func(json.RawMessage, error) { close(done) })
	up.take(contracts.MethodRegisterClusterIngress)(json.RawMessage(`{"accepted":true,"revision":null,"protocol":{}}`), nil)
	<-done
	if !s.IsIngress(p) {
		t.Fatal("not accepted")
	}
}

// TestSilentIngressTimesOutAndTheCursorKeepsItsPlace: an ingress that never answers costs the
// page its buckets after the statistics timeout; its late answer is ignored.
func TestSilentIngressTimesOutAndTheCursorKeepsItsPlace(t *testing.T) {
	s := newTestServer(t, 50*time.Millisecond)
	up := &fakeUpstream{}
	s.Attached(up)
	fast := &fakePeer{id: 1, answer: func(string, json.RawMessage) (json.RawMessage, error) {
		return json.RawMessage(`{"statistics":[{"dayUtc":"2024-05-02","opaque":12345678901234567890}],"nextCursor":"f1"}`), nil
	}}
	silent := &fakePeer{id: 2}
	accept(t, s, up, fast, "node-a")
	accept(t, s, up, silent, "node-b")

	start := time.Now()
	got := make(chan []byte, 2)
	s.TrafficStatistics(json.RawMessage(`{"fromDayUtc":"2024-05-01","toDayUtc":"2024-05-31","limit":4}`), func(b json.RawMessage, err error) {
		if err != nil {
			t.Error(err)
		}
		got <- b
	})
	body := <-got
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("answered after %s, before the timeout", waited)
	}
	page, err := contracts.ReadGetClusterTrafficStatisticsResponse(body, contracts.TrafficStatisticsRequest{FromDayUTC: "2024-05-01", ToDayUTC: "2024-05-31", Limit: 4})
	if err != nil || len(page.Buckets) != 1 || string(page.Buckets[0].Raw) != `{"dayUtc":"2024-05-02","opaque":12345678901234567890}` {
		t.Fatalf("page %s: %v", body, err)
	}
	ps, ok := decodeCursor(page.NextCursor, "2024-05-01", "2024-05-31")
	if !ok || len(ps) != 2 || ps[0] != (position{node: "node-a", cursor: "f1"}) || ps[1] != (position{node: "node-b", failures: 1}) {
		t.Fatalf("cursor positions %+v", ps)
	}
	// The late answer changes nothing and answers nothing.
	silent.mu.Lock()
	late := silent.pending[0]
	silent.mu.Unlock()
	late(json.RawMessage(`{"statistics":[]}`), nil)
	select {
	case b := <-got:
		t.Fatalf("answered twice: %s", b)
	case <-time.After(20 * time.Millisecond):
	}
	if v := counterValue(t, s.metrics.statsFailures.WithLabelValues(failTimeout)); v != 1 {
		t.Fatalf("timeouts counted %v", v)
	}
}

// newRegisteredServer is newTestServer with the registry its metrics are in.
func newRegisteredServer(t *testing.T) (*Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s, err := New(Options{Logger: zerolog.Nop(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return s, reg
}

// series returns the values of metric name in reg: label value → count.
func series(t *testing.T, reg *prometheus.Registry, name, label string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// eventually polls cond for up to five seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	await.Until(t, what, 5*time.Second, cond)
}

// TestOutcomeLabelsAreAFixedSet: every outcome a peer's answer decides is counted under a name of
// the relay's vocabularies or "other" (docs/hostile.md), never under text the peer chose.
func TestOutcomeLabelsAreAFixedSet(t *testing.T) {
	// A peer can put any token before a colon in its error text; as a label value each one
	// would be a new series for as long as the process lives.
	madeUp := &typedsocket.Error{Text: "made-up-name-4711: whatever the peer likes", Data: json.RawMessage("null")}
	t.Run("an accepted ingress's error text never becomes a hint label", func(t *testing.T) {
		s, reg := newRegisteredServer(t)
		up := &fakeUpstream{}
		s.Attached(up)
		fails := &fakePeer{id: 1, answer: func(string, json.RawMessage) (json.RawMessage, error) { return nil, madeUp }}
		busy := &fakePeer{id: 2, answer: func(string, json.RawMessage) (json.RawMessage, error) {
			return nil, &typedsocket.Error{Text: "relay-node-busy: queue full", Data: json.RawMessage("null")}
		}}
		fine := &fakePeer{id: 3, answer: func(string, json.RawMessage) (json.RawMessage, error) { return json.RawMessage(`{}`), nil }}
		accept(t, s, up, fails, "node-a")
		accept(t, s, up, busy, "node-b")
		accept(t, s, up, fine, "node-c")
		if _, err := s.PushRouteTable(json.RawMessage(`{"table":{"revision":1}}`)); err != nil {
			t.Fatal(err)
		}
		eventually(t, "three hints counted", func() bool {
			n := 0.0
			for _, v := range series(t, reg, "relay_ingress_route_table_hints_total", "outcome") {
				n += v
			}
			return n == 3
		})
		want := map[string]float64{"other": 1, "relay-node-busy": 1, "answered": 1}
		if got := series(t, reg, "relay_ingress_route_table_hints_total", "outcome"); !maps.Equal(got, want) {
			t.Fatalf("hint outcomes %v, want %v", got, want)
		}
	})
	t.Run("Cloudly's refusal of a registration counts under a known name or other", func(t *testing.T) {
		s, reg := newRegisteredServer(t)
		up := &fakeUpstream{}
		s.Attached(up)
		refusal := contracts.ClusterIngressRegistrationRefusal{Code: contracts.ClusterIngressRegistrationRefusedCode, Reason: "bearer-refused", RetryAfterMs: 1000}
		for i, err := range []error{madeUp, &typedsocket.Error{Text: refusal.Text(), Data: refusal.Data()}} {
			replied := make(chan error, 1)
			s.Register(&fakePeer{id: uint64(10 + i)}, registration("node-a"), func(_ json.RawMessage, err error) { replied <- err })
			up.take(contracts.MethodRegisterClusterIngress)(nil, err)
			<-replied
		}
		want := map[string]float64{"other": 1, "cluster-ingress-registration-refused": 1}
		if got := series(t, reg, "relay_ingress_registrations_total", "outcome"); !maps.Equal(got, want) {
			t.Fatalf("registration outcomes %v, want %v", got, want)
		}
	})
}

// TestStatisticsBucketsAreJudgedPerIngress: each bucket an ingress answers is judged against the
// ingress that answered and the days asked for, and passed on byte for byte when it is fit; a
// bucket the relay cannot judge (no dayUtc, no nodeId: members of this project's guessed shape)
// is passed on, after the dated ones.
func TestStatisticsBucketsAreJudgedPerIngress(t *testing.T) {
	const (
		own       = `{"dayUtc":"2024-05-02","nodeId":"node-a","hostname":"a.example","requests":1}`
		foreign   = `{"dayUtc":"2024-05-02","nodeId":"node-b","hostname":"b.example","requests":99}`
		notString = `{"dayUtc":"2024-05-03","nodeId":7}`
		undated   = `{"nodeId":"node-a","hostname":"a.example","requests":2,"window":"2024-W18"}`
		nodeless  = `{"dayUtc":"2024-05-01","hostname":"a.example","requests":3}`
		outside   = `{"dayUtc":"2024-06-01","nodeId":"node-a"}`
		notObject = `[1,2]`
	)
	page := func(t *testing.T, buckets ...string) (json.RawMessage, *prometheus.Registry) {
		t.Helper()
		s, reg := newRegisteredServer(t)
		up := &fakeUpstream{}
		s.Attached(up)
		a := &fakePeer{id: 1, answer: func(string, json.RawMessage) (json.RawMessage, error) {
			return json.RawMessage(`{"statistics":[` + strings.Join(buckets, ",") + `]}`), nil
		}}
		accept(t, s, up, a, "node-a")
		got := make(chan json.RawMessage, 1)
		s.TrafficStatistics(json.RawMessage(`{"fromDayUtc":"2024-05-01","toDayUtc":"2024-05-31","limit":10}`), func(b json.RawMessage, err error) {
			if err != nil {
				t.Error(err)
			}
			got <- b
		})
		return <-got, reg
	}
	dropped := func(t *testing.T, reg *prometheus.Registry) map[string]float64 {
		got := series(t, reg, "relay_ingress_statistics_buckets_dropped_total", "reason")
		maps.DeleteFunc(got, func(_ string, v float64) bool { return v == 0 })
		return got
	}
	t.Run("a bucket for another node is dropped and counted", func(t *testing.T) {
		body, reg := page(t, own, foreign, notString)
		if want := `{"statistics":[` + own + `]}`; string(body) != want {
			t.Fatalf("page %s, want %s", body, want)
		}
		if got := dropped(t, reg); !maps.Equal(got, map[string]float64{"foreign-node": 2}) {
			t.Fatalf("dropped %v", got)
		}
	})
	t.Run("a bucket without dayUtc or nodeId is passed on, after the dated ones", func(t *testing.T) {
		body, reg := page(t, undated, own, nodeless)
		if want := `{"statistics":[` + nodeless + `,` + own + `,` + undated + `]}`; string(body) != want {
			t.Fatalf("page %s, want %s", body, want)
		}
		if got := dropped(t, reg); len(got) != 0 {
			t.Fatalf("dropped %v", got)
		}
	})
	t.Run("a bucket outside the days asked for, or not an object, is dropped and counted", func(t *testing.T) {
		body, reg := page(t, outside, own, notObject)
		if want := `{"statistics":[` + own + `]}`; string(body) != want {
			t.Fatalf("page %s, want %s", body, want)
		}
		if got := dropped(t, reg); !maps.Equal(got, map[string]float64{"out-of-range": 1, "malformed": 1}) {
			t.Fatalf("dropped %v", got)
		}
	})
}

func TestCursorRoundTripAndStrictness(t *testing.T) {
	ps := []position{{node: "-a", cursor: "x~1"}, {node: "_b", done: true}, {node: "c", failures: 2, cursor: "q"}}
	c := encodeCursor("2024-01-01", "2024-12-31", ps)
	if !contracts.IsTrafficStatisticsCursor(c) {
		t.Fatalf("minted cursor breaks the grammar: %q", c)
	}
	back, ok := decodeCursor(c, "2024-01-01", "2024-12-31")
	if !ok || len(back) != 3 || back[0] != ps[0] || back[1] != ps[1] || back[2] != ps[2] {
		t.Fatalf("round trip: %+v", back)
	}
	mint := func(s string) string { return cursorPrefix + base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, bad := range []string{
		c[:len(c)-1], // truncated base64
		strings.Replace(c, "c1.", "c2.", 1),
		mint(`{"fromDayUtc":"2024-01-01","toDayUtc":"2024-12-31","ingress":[{"nodeId":"b"},{"nodeId":"a"}]}`), // unsorted
		mint(`{"fromDayUtc":"2024-01-01","toDayUtc":"2024-12-31","ingress":[{"nodeId":"a"},{"nodeId":"a"}]}`), // repeated
		mint(`{"fromDayUtc":"2024-01-01","toDayUtc":"2024-12-31","ingress":[{"nodeId":"a","failures":4}]}`),   // beyond the give-up
		mint(`{"fromDayUtc":"2024-01-01","toDayUtc":"2024-12-31","ingress":[{"nodeId":"a","done":false}]}`),   // done is true or absent
		mint(`{"fromDayUtc":"2024-01-01","toDayUtc":"2024-12-31","ingress":[{"nodeId":"a","cursor":""}]}`),    // empty cursor
		mint(`{"fromDayUtc":"2024-01-01","toDayUtc":"2024-12-31","ingress":[{"nodeId":"a b"}]}`),              // node id
		mint(`{"fromDayUtc":"2024-01-01","toDayUtc":"2024-12-31","ingress":[],"extra":1}`),                    // exact keys
		mint(`{"fromDayUtc":"2024-01-01","fromDayUtc":"2024-01-01","toDayUtc":"2024-12-31","ingress":[]}`),    // duplicate key
		mint(`{"fromDayUtc":"2024-01-01","toDayUtc":"2024-12-31","ingress":[{"nodeId":"a","cursor":"` + strings.Repeat("x", 513) + `"}]}`),
	} {
		if _, ok := decodeCursor(bad, "2024-01-01", "2024-12-31"); ok {
			t.Errorf("decoded %q", bad)
		}
	}
	if _, ok := decodeCursor(c, "2024-01-02", "2024-12-31"); ok {
		t.Error("a cursor read for other days")
	}
}

// TestMetricNames: namespace relay, subsystem ingress, counters end _total, and the set is the
// documented one.
func TestMetricNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics()
	if err := m.register(reg); err != nil {
		t.Fatal(err)
	}
	m.registrations.WithLabelValues("accepted")
	m.tableUpdates.WithLabelValues("push", "applied")
	m.tableReads.WithLabelValues("served")
	m.hints.WithLabelValues("answered")
	m.statsPages.WithLabelValues("answered")
	m.statsFailures.WithLabelValues(failGone)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{
		"relay_ingress_registrations_total": true, "relay_ingress_connections": true, "relay_ingress_route_table_revision": true,
		"relay_ingress_route_table_bytes": true, "relay_ingress_route_table_updates_total": true, "relay_ingress_route_table_reads_total": true,
		"relay_ingress_route_table_hints_total": true, "relay_ingress_statistics_pages_total": true,
		"relay_ingress_statistics_ingress_failures_total": true, "relay_ingress_statistics_ingresses_given_up_total": true,
		"relay_ingress_statistics_buckets_total": true, "relay_ingress_statistics_buckets_dropped_total": true,
	}
	for _, f := range families {
		name := f.GetName()
		if !want[name] {
			t.Errorf("unexpected metric %s", name)
		}
		delete(want, name)
		if !strings.HasPrefix(name, "relay_ingress_") {
			t.Errorf("%s is not in namespace relay, subsystem ingress", name)
		}
		if isCounter := f.GetType().String() == "COUNTER"; isCounter != strings.HasSuffix(name, "_total") {
			t.Errorf("%s: counter %v, but _total suffix %v", name, isCounter, !isCounter)
		}
		if f.GetHelp() == "" {
			t.Errorf("%s has no help", name)
		}
	}
	for name := range want {
		t.Errorf("metric %s missing", name)
	}
}

// FuzzDecodeCursor: Cloudly hands the relay's cursor back, so it is a peer's bytes. Whatever it
// holds, decoding never panics, and what it decodes to survives a re-encoding unchanged.
func FuzzDecodeCursor(f *testing.F) {
	f.Add(encodeCursor("2024-01-01", "2024-01-31", []position{{node: "a", cursor: "o3"}, {node: "b", done: true}, {node: "c", failures: 2}}))
	f.Add(encodeCursor("2024-01-01", "2024-01-31", nil))
	f.Add("c1.e30")
	f.Add("o1")
	f.Fuzz(func(t *testing.T, s string) {
		ps, ok := decodeCursor(s, "2024-01-01", "2024-01-31")
		if !ok {
			return
		}
		again := encodeCursor("2024-01-01", "2024-01-31", ps)
		back, ok := decodeCursor(again, "2024-01-01", "2024-01-31")
		if !ok || !slices.Equal(back, ps) {
			t.Fatalf("positions do not survive a re-encoding: %q -> %+v -> %q -> %+v", s, ps, again, back)
		}
	})
}
