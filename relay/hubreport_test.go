package relay_test

import (
	"encoding/json"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/status"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// testHubKey is the public key of the hub the tests report; a public key is no secret, but the
// relay logs it in short form only, which the tests check.
var testHubKey = [32]byte{0xd1, 0x5c, 0x0e, 0x77, 0x42}

func testHub() *contracts.VPNHubEndpoint {
	return &contracts.VPNHubEndpoint{Address: "192.0.2.5", QUICPort: 4433, NoisePublicKey: contracts.EncodeKey32(testHubKey)}
}

// members reads a JSON object as Cloudly receives it, in its order, refusing a repeated key.
func members(t *testing.T, what string, raw []byte) ([]string, map[string]json.RawMessage) {
	t.Helper()
	obj, err := strictjson.ReadObject(raw)
	if err != nil {
		t.Fatalf("%s is not one JSON object: %v\n%s", what, err, raw)
	}
	var keys []string
	values := map[string]json.RawMessage{}
	for _, m := range obj {
		keys = append(keys, m.Key)
		values[m.Key] = json.RawMessage(m.Value)
	}
	return keys, values
}

// wantKeys fails unless the object raw has exactly the members want, in want's order.
func wantKeys(t *testing.T, what string, raw []byte, want ...string) map[string]json.RawMessage {
	t.Helper()
	keys, values := members(t, what, raw)
	if !slices.Equal(keys, want) {
		t.Fatalf("%s carries the members %q, want exactly %q:\n%s", what, keys, want, raw)
	}
	return values
}

// TestRegistrationIsExactlyTheSeeds decodes the registerClusterRelay body that crossed the wire
// (at the simulated Cloudly) and pins its members at every level: the seed's validators are
// exact-key, so any other member, the hub above all, would get every registration refused by a
// real Cloudly (docs/protocol.md#attaching). With the hub on or off.
func TestRegistrationIsExactlyTheSeeds(t *testing.T) {
	for _, c := range []struct {
		name string
		hub  *contracts.VPNHubEndpoint
	}{{"hub off", nil}, {"hub on", testHub()}} {
		t.Run(c.name, func(t *testing.T) {
			e := relaytest.Start(t, relaytest.Options{VPNHub: c.hub})
			body := e.Cloudly.Last(contracts.MethodRegisterClusterRelay)
			top := wantKeys(t, "registerClusterRelay", body, "protocol", "relay", "registrationSequence")
			wantKeys(t, "registerClusterRelay protocol", top["protocol"], "interfacesVersion", "minimumPeerVersion")
			wantKeys(t, "registerClusterRelay relay", top["relay"], "version", "nodeId", "listenAddress", "listenPort")
			if reasons := contracts.ValidateRegisterClusterRelayRequest(body, ""); len(reasons) > 0 {
				t.Fatalf("the seed's validator refuses the registration: %q", reasons)
			}
		})
	}
}

// TestHubReport: the hub is reported in a call of its own, registerClusterVpnHub, after every
// accepted registration while the hub is on (docs/protocol.md#attaching).
func TestHubReport(t *testing.T) {
	t.Run("reported after each accepted registration, exactly in its shape", func(t *testing.T) {
		e := relaytest.Start(t, relaytest.Options{VPNHub: testHub()})
		hub, err := e.Cloudly.WaitVPNHub(ctxHung(t))
		if err != nil {
			t.Fatal(err)
		}
		want := contracts.ClusterVpnHubReport{Hub: contracts.RuntimeNetworkVpnHub{ClusterID: e.Config.ClusterID, Address: "192.0.2.5", QUICPort: 4433},
			NoisePublicKey: testHubKey}
		if hub != want {
			t.Fatalf("Cloudly learned the hub %+v, want %+v", hub, want)
		}
		body := e.Cloudly.Last(contracts.MethodRegisterClusterVpnHub)
		top := wantKeys(t, "registerClusterVpnHub", body, "hub", "noisePublicKey")
		wantKeys(t, "registerClusterVpnHub hub (IRuntimeNetworkVpnHub)", top["hub"], "clusterId", "address", "quicPort")
		e.Eventually("the report's answer counted", func() bool {
			return e.Metric("relay_upstream_hub_reports_total", "outcome", "accepted") == 1
		})
		st := hubStatus(t, e)
		if st.Cloudly.HubReport == nil || st.Cloudly.HubReport.Outcome != "accepted" || st.Cloudly.HubReport.Sequence != 0 || st.Cloudly.HubReport.At.IsZero() {
			t.Fatalf("/status.json hubReport = %+v", st.Cloudly.HubReport)
		}
		if _, page := statusGet(t, e, "/status"); !strings.Contains(page, `<span id="hub-report">accepted</span>`) {
			t.Fatalf("/status does not show the hub report:\n%s", page)
		}

		e.Cloudly.Drop()
		e.Eventually("re-attached and reported again", func() bool {
			return e.Cloudly.Registrations() == 2 && e.Metric("relay_upstream_hub_reports_total", "outcome", "accepted") == 2
		})
		if got := e.Cloudly.Received(contracts.MethodRegisterClusterVpnHub); got != 2 {
			t.Fatalf("Cloudly received %d hub reports for 2 accepted registrations", got)
		}
		if st := hubStatus(t, e); st.Cloudly.HubReport.Sequence != 1 {
			t.Fatalf("after the second registration: hubReport %+v", st.Cloudly.HubReport)
		}
		if strings.Contains(e.Logs.String(), contracts.EncodeKey32(testHubKey)) {
			t.Fatal("the hub's public key is logged whole: short form only")
		}
	})

	t.Run("without a hub nothing is reported", func(t *testing.T) {
		e := relaytest.Start(t, relaytest.Options{})
		// A node's registration crosses the socket after the relay attached: a report sent on
		// attaching would have crossed before it.
		e.Node("node-a")
		if got := e.Cloudly.Received(contracts.MethodRegisterClusterVpnHub); got != 0 {
			t.Fatalf("a relay without a hub sent %d hub reports", got)
		}
		if st := hubStatus(t, e); st.Cloudly.HubReport != nil {
			t.Fatalf("a relay without a hub shows a hub report: %+v", st.Cloudly.HubReport)
		}
		for _, outcome := range []string{"accepted", "refused", "unknown-method", "timeout", "failed"} {
			if got := e.Metric("relay_upstream_hub_reports_total", "outcome", outcome); got != 0 {
				t.Errorf("hub_reports_total{%s} = %v without a hub", outcome, got)
			}
		}
	})

	// Whatever Cloudly answers costs the report alone: the relay stays attached, keeps custody,
	// carries its nodes, logs the outcome once at warn without the peer's text, and reports again at
	// the next attach.
	const reason = "sim-hub-refusal-reason" // the peer's text, which no log line may quote
	for _, c := range []struct {
		name, outcome string
		answer        error // nil: never answered
		callTimeout   time.Duration
	}{
		// An undispatched name on a registration would end custody; on the hub report it must not.
		{"refused, even with an undispatched refusal's name", "refused", contracts.RelayClusterNotEnabled.Refuse(reason), 0},
		{"refused by a name of no vocabulary", "refused", &typedsocket.Error{Text: "hub-outside-prefix: " + reason, Data: json.RawMessage(`{}`)}, 0},
		{"unknown to a TypedRequest router", "unknown-method", &typedsocket.Error{Text: contracts.TypedRequestNoMethodText, Data: json.RawMessage(`{}`)}, 0},
		{"unknown to a relay-like peer", "unknown-method", contracts.RelayMethodUnknown.Refuse("%s %s", contracts.MethodRegisterClusterVpnHub, reason), 0},
		{"never answered", "timeout", nil, 300 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := relaytest.Start(t, relaytest.Options{VPNHub: testHub(), CallTimeout: c.callTimeout, Cloudly: func(cl *sim.Cloudly) {
				cl.HandleAsync(contracts.MethodRegisterClusterVpnHub, func(_ json.RawMessage, reply func(json.RawMessage, error)) {
					if c.answer != nil {
						reply(nil, c.answer)
					}
				})
			}})
			for attach := 1; attach <= 2; attach++ {
				e.Eventually("the report's outcome counted", func() bool {
					return e.Metric("relay_upstream_hub_reports_total", "outcome", c.outcome) == float64(attach)
				})
				st := hubStatus(t, e)
				if !st.Cloudly.Attached || st.Cloudly.Custody != "held" || st.Cloudly.HubReport == nil ||
					st.Cloudly.HubReport.Outcome != c.outcome || st.Cloudly.HubReport.Sequence != int64(attach-1) {
					t.Fatalf("attach %d: /status.json cloudly = %+v, hubReport %+v", attach, st.Cloudly, st.Cloudly.HubReport)
				}
				if code, _ := statusGet(t, e, "/readyz"); code != 200 {
					t.Fatalf("attach %d: /readyz = %d after the hub report failed", attach, code)
				}
				// Every node is carried, both ways.
				n := e.Node("node-" + string(rune('a'+attach)))
				if _, err := n.Report(ctxHung(t), "reportRuntimeAssignmentObservation", nil); err != nil {
					t.Fatalf("attach %d: a node's request after the hub report: %v", attach, err)
				}
				if got := e.Metric("relay_upstream_registrations_total", "outcome", "accepted"); got != float64(attach) {
					t.Fatalf("attach %d: %v accepted registrations: the hub report cost the relay its attachment", attach, got)
				}
				if got := e.Metric("relay_upstream_detaches_total"); got != float64(attach-1) {
					t.Fatalf("attach %d: %v detaches", attach, got)
				}
				if got := strings.Count(e.Logs.String(), "Cloudly did not take the VPN hub report"); got != attach {
					t.Fatalf("attach %d: the failed report was logged %d times, want once per attach", attach, got)
				}
				if attach == 1 {
					e.Cloudly.Drop() // retried at the next attach
					e.Eventually("re-attached", func() bool { return e.Cloudly.Registrations() == 2 && e.Relay.Upstream().Attached() })
				}
			}
			logs := e.Logs.String()
			for _, line := range strings.Split(logs, "\n") {
				if strings.Contains(line, "VPN hub report") && (!strings.Contains(line, `"level":"warn"`) || !strings.Contains(line, `"outcome":"`+c.outcome+`"`)) {
					t.Errorf("hub report line is not a warning naming its outcome: %s", line)
				}
			}
			if strings.Contains(logs, reason) || strings.Contains(logs, contracts.TypedRequestNoMethodText) {
				t.Error("a log line quotes Cloudly's error text")
			}
		})
	}

	// The report never waits on the attach path or the socket's read loop: while Cloudly holds its
	// answer the relay finishes attaching (its nodes are told), is ready and carries nodes over the
	// same socket; the answer, when it comes, is the outcome.
	t.Run("a held answer blocks nothing", func(t *testing.T) {
		var reports atomic.Int64
		held := make(chan func(json.RawMessage, error), 1)
		e := relaytest.Start(t, relaytest.Options{VPNHub: testHub(), Cloudly: func(cl *sim.Cloudly) {
			cl.HandleAsync(contracts.MethodRegisterClusterVpnHub, func(_ json.RawMessage, reply func(json.RawMessage, error)) {
				if reports.Add(1) == 1 {
					reply(json.RawMessage(`{}`), nil)
					return
				}
				held <- reply // the second attach's report waits for the test
			})
		}})
		e.Eventually("the first report accepted", func() bool {
			return e.Metric("relay_upstream_hub_reports_total", "outcome", "accepted") == 1
		})
		a := e.Node("node-a")
		e.Cloudly.Drop()
		var reply func(json.RawMessage, error)
		select {
		case reply = <-held:
		case <-ctxHung(t).Done():
			t.Fatal("no hub report reached Cloudly after the second registration")
		}
		// The push to carried nodes follows the report on the attach path (upstreamAttached).
		e.Eventually("node-a told the relay is attached again", func() bool { return a.Received(contracts.MethodPushRelayUpstreamChanged) == 1 })
		if st := hubStatus(t, e); st.Cloudly.HubReport == nil || st.Cloudly.HubReport.Outcome != "pending" || !st.Cloudly.Attached {
			t.Fatalf("while the answer is held: cloudly %+v, hubReport %+v", st.Cloudly, st.Cloudly.HubReport)
		}
		if code, _ := statusGet(t, e, "/readyz"); code != 200 {
			t.Fatalf("/readyz = %d while the hub report's answer is held", code)
		}
		b := e.Node("node-b")
		if _, err := b.Report(ctxHung(t), "reportRuntimeAssignmentObservation", nil); err != nil {
			t.Fatalf("a node's request while the hub report's answer is held: %v", err)
		}
		reply(json.RawMessage(`{}`), nil)
		e.Eventually("the held report accepted", func() bool {
			return e.Metric("relay_upstream_hub_reports_total", "outcome", "accepted") == 2
		})
	})

	// A report whose socket is lost before the answer failed; the next attach reports again, and a
	// late outcome of the old report never hides the new one's.
	t.Run("lost with its socket, then reported again", func(t *testing.T) {
		var reports atomic.Int64
		held := make(chan struct{}, 1)
		e := relaytest.Start(t, relaytest.Options{VPNHub: testHub(), Cloudly: func(cl *sim.Cloudly) {
			cl.HandleAsync(contracts.MethodRegisterClusterVpnHub, func(_ json.RawMessage, reply func(json.RawMessage, error)) {
				if reports.Add(1) == 1 {
					held <- struct{}{} // the first is never answered
					return
				}
				reply(json.RawMessage(`{}`), nil)
			})
		}})
		select {
		case <-held:
		case <-ctxHung(t).Done():
			t.Fatal("no hub report reached Cloudly")
		}
		e.Cloudly.Drop()
		e.Eventually("reported again and accepted", func() bool {
			return e.Metric("relay_upstream_hub_reports_total", "outcome", "failed") == 1 &&
				e.Metric("relay_upstream_hub_reports_total", "outcome", "accepted") == 1
		})
		if st := hubStatus(t, e); st.Cloudly.HubReport.Outcome != "accepted" || st.Cloudly.HubReport.Sequence != 1 {
			t.Fatalf("hubReport %+v, want the second registration's accepted report", st.Cloudly.HubReport)
		}
	})
}

func hubStatus(t *testing.T, e *relaytest.Env) status.Snapshot {
	t.Helper()
	code, body := statusGet(t, e, "/status.json")
	var st status.Snapshot
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
		t.Fatalf("/status.json: %d %v", code, err)
	}
	return st
}
