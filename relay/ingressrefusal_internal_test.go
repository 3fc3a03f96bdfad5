package relay

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/status"
)

// TestIngressRefusalShapes: every refusal the relay makes itself of an ingress registration
// travels as the seeds' IClusterIngressRegistrationRefusal with reason not-ready and the relay's
// cause in the text — detached (the reconnect backoff, clamped to 1 000 – 300 000), standing by and
// shutting down (1 000), the anonymous pool full, the Cloudly queue full and a call timeout
// (1 000) — and everything else passes as it came.
func TestIngressRefusalShapes(t *testing.T) {
	r := &Relay{up: &upstream{hist: status.NewSessionLog("")}, now: time.Now}
	r.leading.Store(true)
	wire := func(t *testing.T, err error) (*typedsocket.Error, contracts.ClusterIngressRegistrationRefusal) {
		t.Helper()
		e := typedsocket.ErrorFrom(err)
		if reasons := contracts.ValidateClusterIngressRegistrationRefusal(e.Data, ""); len(reasons) > 0 {
			t.Fatalf("%v travels with data %s: %q", err, e.Data, reasons)
		}
		refusal, _ := contracts.ReadClusterIngressRegistrationRefusal(e.Data)
		return e, refusal
	}
	cases := []struct {
		name     string
		setup    func()
		err      error
		cause    contracts.RefusalName
		afterMin int64
		afterMax int64
	}{
		{"detached, dialling", func() {}, contracts.RelayUpstreamDetached.Refuse("the relay has no Cloudly session"), contracts.RelayUpstreamDetached, 1000, 1000},
		{"detached, 20 s from the next dial", func() { r.up.hist.Waiting(time.Now().Add(20 * time.Second)) },
			contracts.RelayUpstreamDetached.Refuse("the relay has no Cloudly session"), contracts.RelayUpstreamDetached, 19_000, 20_000},
		{"detached, a refused offer's 300 s and more", func() { r.up.hist.Waiting(time.Now().Add(time.Hour)) },
			contracts.RelayUpstreamDetached.Refuse("the relay has no Cloudly session"), contracts.RelayUpstreamDetached, 300_000, 300_000},
		{"the anonymous pool full", func() {}, contracts.RelayNodeBusy.Refuse("the relay has its most anonymous registrations at Cloudly already"), contracts.RelayNodeBusy, 1000, 1000},
		{"the Cloudly socket's queue full", func() {}, contracts.RelayUpstreamBusy.Refuse("full"), contracts.RelayUpstreamBusy, 1000, 1000},
		{"Cloudly did not answer", func() {}, contracts.RelayCallTimeout.Refuse("late"), contracts.RelayCallTimeout, 1000, 1000},
		{"Cloudly's answer unreadable", func() {}, contracts.RelayRequestInvalid.Refuse("not an acceptance"), contracts.RelayRequestInvalid, 1000, 1000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.setup()
			err := r.ingressRefusal(c.err)
			e, refusal := wire(t, err)
			if refusal.Reason != "not-ready" || refusal.RetryAfterMs < c.afterMin || refusal.RetryAfterMs > c.afterMax {
				t.Fatalf("refusal %+v, want not-ready after %d–%d ms", refusal, c.afterMin, c.afterMax)
			}
			if !strings.HasPrefix(e.Text, string(c.cause)+": ") || !errors.Is(err, c.cause) || !errors.Is(e, c.cause) {
				t.Fatalf("text %q: the relay's cause %s is not named", e.Text, c.cause)
			}
			r.up.hist.Waiting(time.Time{})
		})
	}
	t.Run("standing by", func(t *testing.T) {
		r.leading.Store(false)
		defer r.leading.Store(true)
		e, refusal := wire(t, r.ingressNotReady())
		if refusal.RetryAfterMs != 1000 || !strings.HasPrefix(e.Text, "relay-upstream-detached: this relay stands by") {
			t.Fatalf("%q %+v", e.Text, refusal)
		}
	})
	t.Run("shutting down", func(t *testing.T) {
		r.draining.Store(true)
		defer r.draining.Store(false)
		e, refusal := wire(t, r.ingressNotReady())
		if refusal.RetryAfterMs != 1000 || !strings.HasPrefix(e.Text, "relay-upstream-detached: the relay is shutting down") {
			t.Fatalf("%q %+v", e.Text, refusal)
		}
	})
	t.Run("leading and serving: no refusal", func(t *testing.T) {
		if err := r.ingressNotReady(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("everything else passes as it came", func(t *testing.T) {
		cloudly := &typedsocket.Error{Text: "cluster-ingress-registration-refused: bearer-refused", Data: json.RawMessage(`{"code":"cluster-ingress-registration-refused","reason":"bearer-refused","retryAfterMs":5000}`)}
		protocol, _ := contracts.NegotiateProtocol(contracts.RelayOffer, contracts.ProtocolOffer{InterfacesVersion: "31.0.0", MinimumPeerVersion: "31.0.0"})
		invalid := contracts.IngressRegistrationRefusal("registration-invalid", contracts.RelayRequestInvalid.Refuse("x"), 300_000)
		foreign := contracts.RelaySessionForeign.Refuse("this connection carries another peer")
		for _, err := range []error{nil, cloudly, protocol, invalid, foreign} {
			if got := r.ingressRefusal(err); got != err {
				t.Errorf("%v became %v", err, got)
			}
		}
	})
}
