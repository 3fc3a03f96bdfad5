package interop_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/interop"
	"code.foss.global/serve.zone/relay/testenv/await"
)

// requireEnv turns a missing Node.js or package into a failure instead of a skip (.ci/run sets it).
const requireEnv = "RELAY_REQUIRE_INTEROP"

const (
	clusterID = "cluster-interop"
	origin    = "https://relay.cluster-interop.serve.zone:8443"
	token     = "interop-machine-jwt"

	streamBytes = 64 << 20  // one stream each way
	streamChunk = 512 << 10 // bytes per sendData: a ~1.8 MB frame once JSON-serialised
	manyNodes   = 20        // nodes streaming at once
	manyBytes   = 1 << 20   // per node
	manyChunk   = 128 << 10

	// The library's own answer to a method it does not serve.
	noHandler = "There is no available method for this call on the server side"
)

// Refusal names the relay answers stream frames with (docs/protocol.md#streams, project-defined).
const (
	relayStreamUnknown contracts.RefusalName = "relay-stream-unknown"
)

// TestInterop runs the conformance suite twice: "direct", the library's Cloudly and nodes
// talking to each other (the baseline that proves each check right), and "relay", the same
// peers with a real relay process between them.
func TestInterop(t *testing.T) {
	dir, err := interop.Dir()
	if err != nil {
		t.Fatal(err)
	}
	if err := interop.Ready(dir); err != nil {
		if os.Getenv(requireEnv) == "1" {
			t.Fatalf("%v (%s=1: the suite must run)", err, requireEnv)
		}
		t.Skipf("skipped: %v", err)
	}
	trackInputs(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	bin, err := interop.RelayBinary(ctx, dir, t.TempDir())
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"direct", "relay"} {
		t.Run(mode, func(t *testing.T) { runSuite(t, dir, bin, mode == "relay") })
	}
}

// trackInputs stats every file the suite's outcome depends on that the test binary does not
// contain: the relay's sources (the suite builds the relay from them), the peers and the
// installed packages. go test caches a passing result against the files a test looked at, so
// without this a changed relay would be answered with the old relay's cached result.
func trackInputs(dir string) {
	root := filepath.Dir(dir)
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") ||
			strings.HasSuffix(name, ".mjs") || name == "go.mod" || name == "go.sum" {
			os.Stat(path)
		}
		return nil
	})
	for _, f := range []string{"ws/package.json", "@api.global/typedrequest/package.json", "@api.global/typedrequest/dist_bundle/bundle.js"} {
		os.Stat(filepath.Join(dir, "node_modules", f))
	}
}

// suite is one mode's peers. Checks run in order and share them: the nodes registered by
// "register" are the ones every later check uses.
type suite struct {
	viaRelay bool
	hubErr   error // why the relay runs without its hub (no address to bind); nil: the hub is on
	cloudly  *interop.Cloudly
	relay    *interop.Relay // nil in direct mode
	nodes    *interop.Nodes
	ids      []string
}

func runSuite(t *testing.T, dir, bin string, viaRelay bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := &suite{viaRelay: viaRelay}
	for i := 1; i <= manyNodes; i++ {
		s.ids = append(s.ids, fmt.Sprintf("node-%02d", i))
	}
	var err error
	s.cloudly, err = interop.StartCloudly(ctx, dir, interop.CloudlyConfig{
		Token: token, Offer: contracts.RelayOffer, ClusterID: clusterID, Origin: origin,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.cloudly.Close)
	if viaRelay {
		// The hub on, so that the relay reports it (registerClusterVpnHub) to a Cloudly that has no
		// such method.
		rc := interop.RelayConfig{Bin: bin, CloudlyURL: s.cloudly.URL, ClusterID: clusterID, Token: token, WorkDir: t.TempDir()}
		if a, err := interop.HubAddress(); err != nil {
			s.hubErr = err
		} else {
			rc.HubListen = netip.AddrPortFrom(a, 0).String()
		}
		s.relay, err = interop.StartRelay(ctx, rc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.relay.Stop)
	}
	s.nodes, err = interop.StartNodes(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.nodes.Close)
	t.Cleanup(func() { // runs first: the processes are still there
		if !t.Failed() {
			return
		}
		t.Logf("Cloudly peer's console (end):\n%s", last(s.cloudly.Stderr(), 6<<10))
		t.Logf("node peers' console (end):\n%s", last(s.nodes.Stderr(), 6<<10))
		if s.relay != nil {
			t.Logf("relay log (end):\n%s", last(s.relay.Log(), 12<<10))
		}
	})

	t.Run("attach", s.attach)
	t.Run("hub-report-unknown-method", s.hubReport)
	t.Run("register", s.register)
	t.Run("calls", s.calls)
	t.Run("errors", s.errors)
	t.Run("unknown-method", s.unknownMethod)
	t.Run("stream-node-to-cloudly-64MiB", s.streamUp)
	t.Run("stream-cloudly-to-node-64MiB", s.streamDown)
	t.Run("streams-20-nodes-at-once", s.streamsAtOnce)
	t.Run("unknown-stream", s.unknownStream)
	t.Run("alive", s.alive)
}

// url is where nodes connect: the relay's downstream listener, or Cloudly itself.
func (s *suite) url() string {
	if s.relay != nil {
		return s.relay.URL()
	}
	return s.cloudly.URL
}

// attach: the relay opens its client session with the library-driven Cloudly, registers, is
// pushed its configuration and reports ready.
func (s *suite) attach(t *testing.T) {
	if !s.viaRelay {
		t.Skip("direct: there is no relay to attach")
	}
	var st interop.CloudlyStatus
	var ready error
	if !await.Within(30*time.Second, func() bool {
		var err error
		if st, err = s.cloudly.Status(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		ready = s.relay.Ready()
		return st.RelayRegistrations >= 1 && st.ConfigPushes >= 1 && ready == nil
	}) {
		t.Fatalf("not attached after 30 s: relay registrations %d, config pushes answered %d, readyz %v, violations %q",
			st.RelayRegistrations, st.ConfigPushes, ready, st.Violations)
	}
	if len(st.Violations) > 0 || !reflect.DeepEqual(st.Sequences, []int64{0}) {
		t.Fatalf("attached, but Cloudly saw violations %q and registration sequences %v", st.Violations, st.Sequences)
	}
	if st.Received["registerCloudlyClientSession"] != 1 {
		t.Fatalf("registerCloudlyClientSession arrived %d times", st.Received["registerCloudlyClientSession"])
	}
}

// hubReport: the relay reports its hub with registerClusterVpnHub (project-defined) after the
// accepted registration, and this Cloudly serves no such method: the library answers with its own
// "no available method", the answer a real Cloudly without the method gives. The relay counts and
// shows the outcome, logs it once, and stays attached on its one registration; "register" then
// carries every node through it and "alive" checks nothing re-attached since.
func (s *suite) hubReport(t *testing.T) {
	if !s.viaRelay {
		t.Skip("direct: there is no relay to report a hub")
	}
	if s.hubErr != nil {
		if os.Getenv(requireEnv) == "1" {
			t.Fatalf("%v (%s=1: the suite must run)", s.hubErr, requireEnv)
		}
		t.Skipf("skipped: %v", s.hubErr)
	}
	const series = `relay_upstream_hub_reports_total{outcome="unknown-method"}`
	var st interop.CloudlyStatus
	var n float64
	if !await.Within(30*time.Second, func() bool {
		var err error
		if st, err = s.cloudly.Status(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		if n, _, err = s.relay.Sample(series); err != nil {
			t.Fatal(err)
		}
		return st.Routed[contracts.MethodRegisterClusterVpnHub] >= 1 && n >= 1
	}) {
		t.Fatalf("no hub report outcome after 30 s: Cloudly routed %v, the relay counts %s = %v", st.Routed, series, n)
	}
	if st.Routed[contracts.MethodRegisterClusterVpnHub] != 1 || n != 1 || st.Received[contracts.MethodRegisterClusterVpnHub] != 0 {
		t.Fatalf("Cloudly routed %d hub reports (served %d), the relay counts %v unknown-method: want one report, answered by the library",
			st.Routed[contracts.MethodRegisterClusterVpnHub], st.Received[contracts.MethodRegisterClusterVpnHub], n)
	}
	if st.RelayRegistrations != 1 || !reflect.DeepEqual(st.Sequences, []int64{0}) || len(st.Violations) > 0 {
		t.Fatalf("after the hub report: relay registrations %d (sequences %v), violations %q", st.RelayRegistrations, st.Sequences, st.Violations)
	}
	if err := s.relay.Ready(); err != nil {
		t.Fatalf("the relay is not ready after Cloudly did not know its hub report: %v", err)
	}
	hr, err := s.relay.HubReport()
	if err != nil {
		t.Fatal(err)
	}
	if hr.Outcome != "unknown-method" || hr.Sequence != 0 || hr.At.IsZero() {
		t.Fatalf("/status.json cloudly.hubReport = %+v, want unknown-method after registration 0", hr)
	}
	log := s.relay.Log()
	if got := strings.Count(log, "Cloudly did not take the VPN hub report"); got != 1 || !strings.Contains(log, `"outcome":"unknown-method"`) {
		t.Fatalf("the hub report's outcome was logged %d times, want once, naming unknown-method:\n%s", got, last(log, 4<<10))
	}
	if strings.Contains(log, noHandler) {
		t.Fatal("the relay logged the library's error text; it logs refusal names only")
	}
}

// register: every node registers with registerPalletRuntimeSession and gets its own session.
func (s *suite) register(t *testing.T) {
	ctx := ctxFor(t, 60*time.Second)
	reg, err := s.nodes.Connect(ctx, s.url(), s.ids, contracts.RelayOffer)
	if err != nil {
		t.Fatal(err)
	}
	if len(reg.Failures) > 0 || len(reg.Registered) != len(s.ids) {
		t.Fatalf("registered %d of %d nodes; failures: %+v", len(reg.Registered), len(s.ids), reg.Failures)
	}
	st, err := s.cloudly.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st.Nodes, s.ids) {
		t.Fatalf("Cloudly holds sessions for %v, want %v", st.Nodes, s.ids)
	}
	for _, so := range st.Sockets {
		if s.viaRelay != so.Relay {
			t.Fatalf("Cloudly socket %s: relay %v; through the relay only the relay's socket reaches Cloudly, directly only nodes'", so.Name, so.Relay)
		}
	}
}

// echoFields is a body with a bit of everything JSON has.
var echoFields = map[string]any{
	"text":  "héllo ✓ \u2028 \"quoted\" \\ </script>",
	"int":   9007199254740991,
	"float": 1.5,
	"neg":   -42,
	"list":  []any{1, "two", nil, true, false, map[string]any{"deep": map[string]any{"er": []any{}}}},
	"empty": map[string]any{},
}

// calls: node → Cloudly and Cloudly → node requests are answered, one and then every node at
// once in both directions, each by the peer it was meant for.
func (s *suite) calls(t *testing.T) {
	ctx := ctxFor(t, 60*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(s.ids))
	for _, id := range s.ids {
		wg.Add(2)
		go func() {
			defer wg.Done()
			out, err := s.nodes.Call(ctx, id, "interopEcho", echoFields)
			errs <- checkEcho("node → Cloudly", id, out, err)
		}()
		go func() {
			defer wg.Done()
			out, err := s.cloudly.Call(ctx, id, "interopEcho", echoFields)
			errs <- checkEcho("Cloudly → node", id, out, err)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// checkEcho: the answer is { echo: <the request body>, node: <the node> }, the body with the
// node's own session and every field as sent.
func checkEcho(dir, node string, out interop.Outcome, err error) error {
	if err != nil {
		return fmt.Errorf("%s %s: %v", dir, node, err)
	}
	if len(out.Error) > 0 {
		return fmt.Errorf("%s %s: answered with error %s", dir, node, out.Error)
	}
	var resp struct {
		Echo map[string]any `json:"echo"`
		Node string         `json:"node"`
	}
	if err := json.Unmarshal(out.Response, &resp); err != nil {
		return fmt.Errorf("%s %s: answer %s: %v", dir, node, out.Response, err)
	}
	session, _ := resp.Echo["session"].(map[string]any)
	if resp.Node != node || session["nodeId"] != node {
		return fmt.Errorf("%s %s: answered by %q for session %v", dir, node, resp.Node, session["nodeId"])
	}
	delete(resp.Echo, "session")
	want, _ := json.Marshal(echoFields)
	var wantV any
	json.Unmarshal(want, &wantV)
	if !reflect.DeepEqual(any(resp.Echo), wantV) {
		got, _ := json.Marshal(resp.Echo)
		return fmt.Errorf("%s %s: body arrived as %s, sent %s", dir, node, got, want)
	}
	return nil
}

// errors: a handler's TypedResponseError arrives with its text and data as thrown — data an
// object, null, or absent (absent stays absent: no "data":null appears) — in both directions.
func (s *suite) errors(t *testing.T) {
	cases := []struct {
		name   string
		fields map[string]any
		want   string // the error as the caller's library surfaces it
	}{
		{"with-data", map[string]any{"text": "interop-refused: with data", "data": map[string]any{"code": "interop-refused", "n": 1, "list": []any{"a", nil}}},
			`{"text":"interop-refused: with data","data":{"code":"interop-refused","list":["a",null],"n":1}}`},
		{"null-data", map[string]any{"text": "interop-refused: null data", "data": nil},
			`{"text":"interop-refused: null data","data":null}`},
		{"without-data", map[string]any{"text": "interop-refused: without data"},
			`{"text":"interop-refused: without data"}`},
	}
	for _, c := range cases {
		t.Run("node-to-cloudly/"+c.name, func(t *testing.T) {
			out, err := s.nodes.Call(ctxFor(t, 30*time.Second), s.ids[2], "interopFail", c.fields)
			wantError(t, out, err, c.want)
		})
		t.Run("cloudly-to-node/"+c.name, func(t *testing.T) {
			out, err := s.cloudly.Call(ctxFor(t, 30*time.Second), s.ids[3], "interopFail", c.fields)
			wantError(t, out, err, c.want)
		})
	}
}

func wantError(t *testing.T, out interop.Outcome, err error, want string) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if len(out.Error) == 0 || json.Compact(&got, out.Error) != nil {
		t.Fatalf("answered %s, want the error %s", out.Response, want)
	}
	if got.String() != want {
		t.Fatalf("error arrived as %s, want %s", got.String(), want)
	}
}

// unknownMethod: a method nobody serves is answered by name, never with a closed socket. From a
// node, one of the relay's own Cloudly methods is the relay's relay-method-unknown (directly,
// Cloudly's library has no handler for it); a method Cloudly does not serve is the library's own
// "no handler" answer, passed on untouched, in both directions.
func (s *suite) unknownMethod(t *testing.T) {
	t.Run("relay-only-method-from-node", func(t *testing.T) {
		out, err := s.nodes.Call(ctxFor(t, 30*time.Second), s.ids[4], contracts.MethodPushClusterRelayConfig,
			map[string]any{"config": map[string]any{"clusterId": clusterID, "relay": nil, "corestores": []any{}}})
		if err != nil {
			t.Fatal(err)
		}
		if s.viaRelay {
			if out.ErrorName() != contracts.RelayMethodUnknown {
				t.Fatalf("answered %s / error %s, want %s", out.Response, out.Error, contracts.RelayMethodUnknown)
			}
			return
		}
		if out.ErrorText() != noHandler {
			t.Fatalf("answered %s / error %s, want the library's %q", out.Response, out.Error, noHandler)
		}
	})
	want := `{"text":"` + noHandler + `","data":{}}`
	t.Run("unserved-method-node-to-cloudly", func(t *testing.T) {
		out, err := s.nodes.Call(ctxFor(t, 30*time.Second), s.ids[4], "interopNoSuchMethod", map[string]any{"x": 1})
		wantError(t, out, err, want)
	})
	t.Run("unserved-method-cloudly-to-node", func(t *testing.T) {
		out, err := s.cloudly.Call(ctxFor(t, 30*time.Second), s.ids[4], "interopNoSuchMethod", map[string]any{"x": 1})
		wantError(t, out, err, want)
	})
}

// streamUp: a VirtualStream in a node's request to Cloudly carries 64 MiB, byte-identical.
func (s *suite) streamUp(t *testing.T) {
	u, err := s.nodes.Upload(ctxFor(t, 5*time.Minute), s.ids[:1], streamBytes, streamChunk)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range u.Results {
		checkStream(t, r, streamBytes)
	}
}

// streamDown: a VirtualStream in Cloudly's request to a node carries 64 MiB, byte-identical.
func (s *suite) streamDown(t *testing.T) {
	r, err := s.cloudly.Download(ctxFor(t, 5*time.Minute), s.ids[1], streamBytes, streamChunk)
	if err != nil {
		t.Fatal(err)
	}
	checkStream(t, r, streamBytes)
}

// streamsAtOnce: every node streams to Cloudly at the same time; each stream arrives whole.
func (s *suite) streamsAtOnce(t *testing.T) {
	u, err := s.nodes.Upload(ctxFor(t, 5*time.Minute), s.ids, manyBytes, manyChunk)
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Results) != len(s.ids) {
		t.Fatalf("%d results for %d nodes", len(u.Results), len(s.ids))
	}
	for _, r := range u.Results {
		checkStream(t, r, manyBytes)
	}
}

func checkStream(t *testing.T, r interop.StreamResult, size int64) {
	t.Helper()
	switch got := r.Received(); {
	case r.Failure != "":
		t.Errorf("%s: no answer: %s", r.Node, r.Failure)
	case len(r.Error) > 0:
		t.Errorf("%s: answered with error %s", r.Node, r.Error)
	case r.Sent == nil:
		t.Errorf("%s: the sender did not finish writing (%v)", r.Node, r.WriteError)
	case got == nil:
		t.Errorf("%s: answer %s carries no digest", r.Node, r.Response)
	case r.Sent.Bytes != size || *got != *r.Sent:
		t.Errorf("%s: sent %d bytes sha256 %s, received %d bytes sha256 %s", r.Node, r.Sent.Bytes, r.Sent.SHA256, got.Bytes, got.SHA256)
	}
}

// streamFrame is a keep-alive frame, as the library builds one, for a stream nobody opened; with
// a correlation when id is not empty (an answer needs one).
func streamFrame(cycle, id string) map[string]any {
	f := map[string]any{
		"method": "##VirtualStream##",
		"request": map[string]any{
			"streamId": "uni_interop_never_opened", "cycleId": cycle, "cycle": "request",
			"mainPurpose": "keepAlive", "keepAlive": true,
		},
		"response": nil,
	}
	if id != "" {
		f["correlation"] = map[string]any{"id": id, "phase": "request"}
	}
	return f
}

// unknownStream: a stream frame for a stream nobody opened is answered by name, from either
// side, when it carries a correlation: the relay's relay-stream-unknown, or directly the
// library's own answer (the frame back, response null, as its router answers a stream it does
// not know). Without a correlation the relay drops it (nothing comes back); directly the library
// still answers it.
func (s *suite) unknownStream(t *testing.T) {
	check := func(t *testing.T, answer json.RawMessage, id string) {
		t.Helper()
		var a struct {
			Method      string            `json:"method"`
			Correlation map[string]string `json:"correlation"`
			Response    json.RawMessage   `json:"response"`
			Error       *struct {
				Text string          `json:"text"`
				Data json.RawMessage `json:"data"`
			} `json:"error"`
		}
		if string(answer) == "null" || json.Unmarshal(answer, &a) != nil {
			t.Fatalf("no answer (%s)", answer)
		}
		if a.Method != "##VirtualStream##" || a.Correlation["id"] != id {
			t.Fatalf("answer %s does not repeat the method and correlation id %s", answer, id)
		}
		if s.viaRelay {
			if a.Error == nil || contracts.ReadRefusalName(a.Error.Text, a.Error.Data) != relayStreamUnknown || a.Correlation["phase"] != "response" {
				t.Fatalf("answer %s, want a response with error %s", answer, relayStreamUnknown)
			}
			return
		}
		if a.Error != nil || string(a.Response) != "null" {
			t.Fatalf("answer %s, want the library's own: the frame back, response null", answer)
		}
	}
	t.Run("from-node", func(t *testing.T) {
		answer, err := s.nodes.Raw(ctxFor(t, 30*time.Second), s.ids[5], streamFrame("uni_interop_cycle_1", "interop-unknown-stream-1"), 10_000)
		if err != nil {
			t.Fatal(err)
		}
		check(t, answer, "interop-unknown-stream-1")
	})
	t.Run("from-cloudly", func(t *testing.T) {
		answer, err := s.cloudly.Raw(ctxFor(t, 30*time.Second), s.ids[6], streamFrame("uni_interop_cycle_2", "interop-unknown-stream-2"), 10_000)
		if err != nil {
			t.Fatal(err)
		}
		check(t, answer, "interop-unknown-stream-2")
	})
	t.Run("from-node-without-correlation", func(t *testing.T) {
		answer, err := s.nodes.Raw(ctxFor(t, 30*time.Second), s.ids[7], streamFrame("uni_interop_cycle_3", ""), 1_000)
		if err != nil {
			t.Fatal(err)
		}
		if s.viaRelay != (string(answer) == "null") {
			t.Fatalf("answer %s: the relay drops such a frame, the library answers it", answer)
		}
	})
}

// alive: at the end the relay runs, is still attached on its first registration (nothing
// detached the cluster), and every node socket is open; no peer saw a stray answer, a frame it
// could not read, or a frame out of Cloudly's order.
func (s *suite) alive(t *testing.T) {
	ctx := ctxFor(t, 30*time.Second)
	if s.viaRelay {
		if err := s.relay.Alive(); err != nil {
			t.Errorf("relay: %v", err)
		}
		if err := s.relay.Ready(); err != nil {
			t.Errorf("relay: %v", err)
		}
	}
	cs, err := s.cloudly.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.viaRelay && (cs.RelayRegistrations != 1 || len(cs.Sequences) != 1) {
		t.Errorf("the relay registered %d times (sequences %v): it re-attached, so its socket to Cloudly was lost", cs.RelayRegistrations, cs.Sequences)
	}
	if s.viaRelay && s.hubErr == nil && cs.Routed[contracts.MethodRegisterClusterVpnHub] != 1 {
		t.Errorf("Cloudly saw %d hub reports: the relay reports once per accepted registration", cs.Routed[contracts.MethodRegisterClusterVpnHub])
	}
	if len(cs.Violations) > 0 || cs.Unhandled > 0 {
		t.Errorf("Cloudly saw violations %q and %d unhandled rejections", cs.Violations, cs.Unhandled)
	}
	for _, so := range cs.Sockets {
		if so.Relay && !so.Open {
			t.Errorf("Cloudly: the relay's socket %s closed (%d %s)", so.Name, so.CloseCode, so.CloseReason)
		}
		if so.Stray+so.Malformed+so.RouteFailures > 0 {
			t.Errorf("Cloudly socket %s: %d stray answers, %d unreadable frames, %d frames the router threw on", so.Name, so.Stray, so.Malformed, so.RouteFailures)
		}
	}
	ns, err := s.nodes.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	open := 0
	for _, n := range ns.Nodes {
		if n.Open {
			open++
		} else {
			t.Errorf("node %s: socket closed (%d %s)", n.ID, n.CloseCode, n.CloseReason)
		}
		if n.Stray+n.Malformed+n.RouteFailures > 0 {
			t.Errorf("node %s: %d stray answers, %d unreadable frames, %d frames the router threw on", n.ID, n.Stray, n.Malformed, n.RouteFailures)
		}
	}
	if open != len(s.ids) || ns.Unhandled > 0 {
		t.Errorf("%d of %d node sockets open; %d unhandled rejections in the node process", open, len(s.ids), ns.Unhandled)
	}
}

// ctxFor is a context for one check, ended with it.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func last(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}
