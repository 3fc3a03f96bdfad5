package relay_test

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/escrow"
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// TestAttach: the relay's session with Cloudly (docs/protocol.md#upstream-session): registration, readiness, secrets and
// refusals.
func TestAttach(t *testing.T) {
	t.Parallel() // most of its time is the relay's backoff before it dials again: other tests run beside it
	t.Run("registrationSequence counts up across reconnects", func(t *testing.T) {
		e := start(t, relay.Features{})
		if code, _ := e.admin("/readyz"); code != 200 {
			t.Fatalf("/readyz = %d while attached", code)
		}
		if code, _ := e.admin("/healthz"); code != 200 {
			t.Fatalf("/healthz = %d", code)
		}
		for i := int64(2); i <= 3; i++ {
			e.cloudly.Drop()
			e.eventually("re-attached", func() bool { return e.cloudly.Registrations() == i && e.relay.Upstream().Attached() })
		}
		if got := e.cloudly.Sequences(); !slices.Equal(got, []int64{0, 1, 2}) {
			t.Fatalf("registrationSequence = %v, want [0 1 2]", got)
		}
		// The registration the sim Cloudly accepted is checked there with the seed validator; check
		// what the relay reports about itself too.
		var reg contracts.RegisterClusterRelayRequest
		if err := json.Unmarshal(e.cloudly.Last(contracts.MethodRegisterClusterRelay), &reg); err != nil {
			t.Fatal(err)
		}
		if reg.Relay.NodeID != "relay-node" || reg.Relay.ListenAddress != "192.0.2.1" ||
			reg.Relay.ListenPort != e.relay.DownstreamAddr().(*net.TCPAddr).Port || reg.Relay.Version != relay.DefaultBuildVersion {
			t.Fatalf("registration = %+v", reg)
		}
	})

	t.Run("/readyz follows the attachment", func(t *testing.T) {
		e := start(t, relay.Features{})
		e.cloudly.SetAvailable(false)
		e.eventually("detached", func() bool { return !e.relay.Upstream().Attached() })
		if code, body := e.admin("/readyz"); code != 503 || !strings.Contains(body, "detached") {
			t.Fatalf("/readyz = %d %q while detached", code, body)
		}
		if code, _ := e.admin("/healthz"); code != 200 {
			t.Fatalf("/healthz = %d while detached: liveness must not follow Cloudly", code)
		}
		e.cloudly.SetAvailable(true)
		e.waitAttached()
		if code, _ := e.admin("/readyz"); code != 200 {
			t.Fatalf("/readyz = %d after re-attaching", code)
		}
	})

	// docs/protocol.md#attaching: the accepted answer to registerClusterRelay carries the cluster's origin, which
	// the relay records when present and never requires: the answer's key names are this project's
	// guess (tolerance), so an answer without one attaches all the same.
	t.Run("an answer without an origin attaches", func(t *testing.T) {
		e := relaytest.Start(t, relaytest.Options{Cloudly: func(c *sim.Cloudly) { c.Origin = "" }})
		if !strings.Contains(string(e.Cloudly.Last(contracts.MethodRegisterClusterRelay)), `"registrationSequence":0`) {
			t.Fatal("the relay registered more than once before attaching")
		}
		if got := e.Metric("relay_upstream_registrations_total", "outcome", "accepted"); got != 1 {
			t.Fatalf("registrations_total{accepted} = %v, want 1", got)
		}
	})

	// A request Cloudly sends right after accepting the relay's registration must be served as coming
	// from the attached session. The relay reads it on the socket's read loop before the session
	// goroutine has recorded the attachment, and escrow refused it as not from Cloudly.
	t.Run("a request right after the accepted registration is from the attached session", func(t *testing.T) {
		esc, err := escrow.New(escrow.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var answers []error
		e := relaytest.Start(t, relaytest.Options{Features: relay.Features{Parts: []relay.Part{{Name: "escrow", Impl: esc}}}, Cloudly: func(c *sim.Cloudly) {
			// A clearing hold: refused by shape at worst, never as not from Cloudly.
			c.CallAfterAccepting(contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, json.RawMessage(`{}`), func(rep typedsocket.Reply) {
				mu.Lock()
				answers = append(answers, rep.Err)
				mu.Unlock()
			})
		}})
		held := func() int { mu.Lock(); defer mu.Unlock(); return len(answers) }

		const attaches = 5
		for i := 1; i <= attaches; i++ {
			e.Eventually("the hold after an accepted registration answered", func() bool { return held() >= i })
			if i < attaches {
				e.Cloudly.Drop() // attach again
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for i, err := range answers {
			if errors.Is(err, contracts.EscrowCloudlyOnly) {
				t.Fatalf("attach %d: the hold sent on the attached session just after its registration was accepted was refused %v", i+1, err)
			}
		}
	})

	t.Run("the JWT is re-read at every attach and never logged", func(t *testing.T) {
		e := start(t, relay.Features{})
		e.cloudly.Token = "rotated-machine-jwt-value"
		if err := os.WriteFile(e.cfg.CloudlyTokenFile, []byte("rotated-machine-jwt-value\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		e.cloudly.Drop()
		e.eventually("re-attached with the rotated JWT", func() bool { return e.cloudly.Registrations() == 2 })
		for _, secret := range []string{"sim-machine-jwt", "rotated-machine-jwt-value"} {
			if strings.Contains(e.logs.String(), secret) {
				t.Fatalf("the machine JWT reached the log")
			}
		}
	})

	// A query string in --cloudly-url (a token an operator put there) never
	// reaches the log, at any level.
	t.Run("a query in --cloudly-url is never logged", func(t *testing.T) {
		x := relaytest.Start(t, relaytest.Options{Configure: func(c *relay.Config) { c.CloudlyURL += "?access_token=s3cret-in-url" }})
		x.Shutdown()
		if logs := x.Logs.String(); strings.Contains(logs, "s3cret-in-url") || !strings.Contains(logs, "relay serving") {
			t.Fatalf("the URL's query reached the log (or nothing was logged):\n%s", logs)
		}
	})

	t.Run("a protocol refusal from Cloudly waits the seed interval", func(t *testing.T) {
		e := start(t, relay.Features{})
		e.cloudly.Offer = contracts.ProtocolOffer{InterfacesVersion: "33.1.0", MinimumPeerVersion: "33.0.0"}
		e.cloudly.Drop()
		e.eventually("the refusal described and a 300 s wait", func() bool {
			logs := e.logs.String()
			return strings.Contains(logs, "protocol-incompatible: major-mismatch") && strings.Contains(logs, `"wait":300000`)
		})
		if n := len(e.cloudly.Sequences()); n != 1 {
			t.Fatalf("a refused client session still sent a registration (%d registrations)", n)
		}
	})
}

// TestCustody: whether Cloudly dispatches to the relay (docs/protocol.md#refusals-that-end-custody and docs/protocol.md#relay-configuration-push).
func TestCustody(t *testing.T) {
	t.Parallel() // most of its time is the relay's backoff before it dials again: other tests run beside it
	t.Run("an undispatched refusal ends custody", func(t *testing.T) {
		esc := &recordingEscrow{}
		e := start(t, relay.Features{Parts: []relay.Part{{Name: "escrow", Impl: esc}}})
		e.cloudly.SetRegistrationRefusal(contracts.RelayNodeForeign.Refuse("node relay-node is not in cluster-sim"))
		e.cloudly.Drop()
		e.eventually("custody ended", func() bool { return esc.custodyEnded() > 0 })
		n := newNode(t, e, "node-a")
		_, err := n.Register(ctxHung(t))
		wantRefusal(t, err, contracts.RelayNodeForeign)
		if got := e.cloudly.NodeRegistrations("node-a"); got != 0 {
			t.Fatalf("Cloudly saw %d registrations of node-a while custody had ended", got)
		}
		e.cloudly.SetRegistrationRefusal(nil)
		e.waitAttached()
		if _, err := n.Register(ctxHung(t)); err != nil {
			t.Fatalf("registration after custody resumed: %v", err)
		}
	})

	t.Run("another refusal keeps custody", func(t *testing.T) {
		esc := &recordingEscrow{}
		e := start(t, relay.Features{Parts: []relay.Part{{Name: "escrow", Impl: esc}}})
		e.cloudly.SetRegistrationRefusal(&contracts.Refusal{Name: "relay-unverified", Reason: "could not verify the relay"})
		e.cloudly.Drop()
		e.eventually("refused again", func() bool { return len(e.cloudly.Sequences()) >= 3 })
		if esc.custodyEnded() != 0 {
			t.Fatal("a refusal outside clusterRelayUndispatchedRefusals ended custody")
		}
		n := newNode(t, e, "node-a")
		_, err := n.Register(ctxHung(t))
		wantRefusal(t, err, contracts.RelayUpstreamDetached) // not attached, but custody is kept
		e.cloudly.SetRegistrationRefusal(nil)
	})

	t.Run("the configuration push: relay null ends custody, a relay block resumes it", func(t *testing.T) {
		esc := &recordingEscrow{}
		e := start(t, relay.Features{Parts: []relay.Part{{Name: "escrow", Impl: esc}}})
		ctx := ctxHung(t)
		push := func(relayBlock any, cluster string) error {
			_, err := e.cloudly.Call(ctx, contracts.MethodPushClusterRelayConfig, mustJSON(map[string]any{
				"config": map[string]any{"clusterId": cluster, "relay": relayBlock, "corestores": []any{}}}))
			return err
		}
		wantRefusal(t, push(nil, "another-cluster"), contracts.RelayRequestInvalid)
		if err := push(nil, e.cloudly.ClusterID); err != nil {
			t.Fatal(err)
		}
		if esc.custodyEnded() == 0 {
			t.Fatal("relay: null did not end custody")
		}
		n := newNode(t, e, "node-a")
		_, err := n.Register(ctx)
		wantRefusal(t, err, contracts.RelayClusterNotEnabled)
		if err := push(map[string]any{"origin": e.cloudly.Origin}, e.cloudly.ClusterID); err != nil {
			t.Fatal(err)
		}
		if _, err := n.Register(ctx); err != nil {
			t.Fatalf("registration after the relay was enabled again: %v", err)
		}
		wantRefusal(t, push(map[string]any{"origin": "https://relay.example:443"}, e.cloudly.ClusterID), contracts.RelayRequestInvalid)
	})

	// A pushClusterRelayConfig with relay: null is relay-cluster-not-enabled (docs/protocol.md#relay-configuration-push): custody
	// ends and new node registrations are refused by that name without asking Cloudly (docs/protocol.md#refusals-that-end-custody).
	// Cloudly pushes it right after accepting the registration; the relay reads the push on the
	// socket's read loop before its session goroutine records the attachment, and recording the
	// attachment then cleared the custody refusal the push had just set.
	t.Run("a relay disabled by the push after the acceptance stays disabled", func(t *testing.T) {
		e := relaytest.Start(t, relaytest.Options{Cloudly: func(c *sim.Cloudly) { c.DisableRelay() }})
		e.Eventually("the relay answered the configuration push", func() bool { return e.Cloudly.ConfigPushes() >= 1 })

		n := e.Dial("node-a")
		_, err := n.Register(ctxHung(t))
		wantRefusal(t, err, contracts.RelayClusterNotEnabled)
		if got := e.Cloudly.Received(contracts.MethodRegisterPalletRuntimeSession); got != 0 {
			t.Fatalf("the disabled relay forwarded %d node registrations to Cloudly; custody was restored by the attach that preceded the push", got)
		}
	})
}

// recordingEscrow is a port fake: an escrow feature that records what the relay tells it.
type recordingEscrow struct {
	up       feature.Upstream // set by UseUpstream
	mu       sync.Mutex
	ended    int
	attached []bool
	bound    []string
	gone     []string
}

func (r *recordingEscrow) Methods() (fromCloudly, fromDownstream []string) {
	hold := []string{contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals}
	return hold, hold
}
func (r *recordingEscrow) UseUpstream(up feature.Upstream) { r.up = up }
func (r *recordingEscrow) ServeCloudly(_ string, _ json.RawMessage, reply feature.Reply) {
	if !r.up.Attached() {
		reply(nil, contracts.EscrowCloudlyOnly.Refuse("not from the attached Cloudly session"))
		return
	}
	reply(json.RawMessage(`{"held":0}`), nil)
}
func (r *recordingEscrow) ServeDownstream(_ string, _ feature.Peer, _ json.RawMessage, reply feature.Reply) {
	reply(nil, contracts.EscrowCloudlyOnly.Refuse("not from the attached Cloudly session"))
}
func (r *recordingEscrow) Attached(feature.Upstream) { r.record(&r.attached, true) }
func (r *recordingEscrow) Detached()                 { r.record(&r.attached, false) }
func (r *recordingEscrow) CustodyEnded()             { r.mu.Lock(); r.ended++; r.mu.Unlock() }
func (r *recordingEscrow) NodeBound(n feature.Node) {
	r.mu.Lock()
	r.bound = append(r.bound, n.Session().NodeID)
	r.mu.Unlock()
}
func (r *recordingEscrow) PeerGone(p feature.Peer) {
	if n, ok := p.(feature.Node); ok && n.Session().NodeID != "" {
		r.mu.Lock()
		r.gone = append(r.gone, n.Session().NodeID)
		r.mu.Unlock()
	}
}
func (r *recordingEscrow) record(to *[]bool, v bool) {
	r.mu.Lock()
	*to = append(*to, v)
	r.mu.Unlock()
}
func (r *recordingEscrow) custodyEnded() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended
}
