package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/ingress"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// startWithIngress runs a relay with the ingress part against a Cloudly that plays the ingress's
// side (sim.ServeIngress).
func startWithIngress(t *testing.T) (*relaytest.Env, *sim.IngressControl) {
	t.Helper()
	var ic *sim.IngressControl
	e := relaytest.Start(t, relaytest.Options{
		Cloudly: func(c *sim.Cloudly) { ic = sim.ServeIngress(c) },
		Build: func(cfg relay.Config, o relay.Options) (*relay.Relay, error) {
			in, err := ingress.New(ingress.Options{Logger: o.Logger, Registerer: o.Registry})
			if err != nil {
				return nil, err
			}
			return relay.New(cfg, relay.Features{Parts: []relay.Part{{Name: "ingress", Impl: in}}}, o)
		},
	})
	return e, ic
}

// TestIngressBacksOffByTheRelaysRefusal: an ingress registration the relay refuses itself while
// detached travels as the seeds' IClusterIngressRegistrationRefusal (code
// cluster-ingress-registration-refused, reason not-ready, retryAfterMs from the relay's reconnect
// backoff, 1 000 – 300 000), with the relay's cause in the text. An ingress that knows only the
// seeds reads it, waits exactly retryAfterMs and is accepted once the relay is attached again.
func TestIngressBacksOffByTheRelaysRefusal(t *testing.T) {
	e, ic := startWithIngress(t)
	ic.Designate("node-i", "bearer-i")
	e.Cloudly.SetAvailable(false)
	e.Eventually("detached", func() bool { return !e.Relay.Upstream().Attached() })
	in := sim.NewIngress("node-i", "bearer-i", zerolog.Nop())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := in.Connect(ctx, e.URL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Close)

	_, err := in.Register(ctx)
	var remote *typedsocket.Error
	if !errors.As(err, &remote) {
		t.Fatalf("registration while detached: %v", err)
	}
	if reasons := contracts.ValidateClusterIngressRegistrationRefusal(remote.Data, ""); len(reasons) > 0 {
		t.Fatalf("error data %s is not the seed's refusal: %q", remote.Data, reasons)
	}
	refusal, _ := contracts.ReadClusterIngressRegistrationRefusal(remote.Data)
	if refusal.Reason != "not-ready" || !strings.HasPrefix(remote.Text, string(contracts.RelayUpstreamDetached)+": ") {
		t.Fatalf("refusal %+v with text %q, want not-ready and the relay's cause in the text", refusal, remote.Text)
	}
	if !errors.Is(err, contracts.RelayUpstreamDetached) {
		t.Fatal("the relay's cause is not readable by its name on this side")
	}

	// Backing off by the refusal: while the ingress waits, Cloudly comes back.
	var asked []time.Duration
	resp, waits, err := in.RegisterBackingOff(ctx, func(ctx context.Context, d time.Duration) error {
		asked = append(asked, d)
		if len(asked) == 1 {
			e.Cloudly.SetAvailable(true)
			e.WaitAttached()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("an ingress that knows only the seeds cannot back off: %v", err)
	}
	if len(waits) != 1 || waits[0] < time.Second || waits[0] > 300*time.Second {
		t.Fatalf("waits %v, want one wait of retryAfterMs, 1 s to 300 s", waits)
	}
	if !contracts.ReadClusterIngressRegistrationAcceptance(resp) || in.Registrations() != 1 {
		t.Fatalf("not accepted after backing off: %s", resp)
	}
}

// TestIngressRefusalsCloudlyMakesPassUntouched is the negative twin: Cloudly's own refusal and a
// protocol refusal are not reshaped, and a body the relay cannot read is registration-invalid.
func TestIngressRefusalsCloudlyMakesPassUntouched(t *testing.T) {
	e, _ := startWithIngress(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	in := sim.NewIngress("node-i", "bearer-i", zerolog.Nop()) // not designated: Cloudly refuses
	if err := in.Connect(ctx, e.URL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Close)
	_, err := in.Register(ctx)
	var remote *typedsocket.Error
	if !errors.As(err, &remote) {
		t.Fatal(err)
	}
	want := contracts.ClusterIngressRegistrationRefusal{Code: contracts.ClusterIngressRegistrationRefusedCode, Reason: "ingress-not-designated", RetryAfterMs: 5000}
	if remote.Text != want.Text() || string(remote.Data) != string(want.Data()) {
		t.Fatalf("Cloudly's refusal arrived as %q / %s", remote.Text, remote.Data)
	}
	old := sim.NewIngress("node-o", "bearer-o", zerolog.Nop())
	old.Offer = contracts.ProtocolOffer{InterfacesVersion: "31.0.0", MinimumPeerVersion: "31.0.0"}
	if err := old.Connect(ctx, e.URL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(old.Close)
	_, err = old.Register(ctx)
	if !errors.As(err, &remote) {
		t.Fatal(err)
	}
	if _, ok := contracts.ReadProtocolRefusal(remote.Data); !ok {
		t.Fatalf("a protocol refusal arrived as %s", remote.Data)
	}
}
