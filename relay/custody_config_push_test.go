package relay_test

import (
	"testing"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/relaytest"
	"code.foss.global/serve.zone/relay/internal/sim"
)

// A pushClusterRelayConfig with relay: null is relay-cluster-not-enabled (SPEC §4.1): custody
// ends and new node registrations are refused by that name without asking Cloudly (SPEC §4.4).
// Cloudly pushes it right after accepting the registration; the relay reads the push on the
// socket's read loop before its session goroutine records the attachment, and recording the
// attachment then cleared the custody refusal the push had just set.
func TestRelayDisabledByThePushAfterAcceptanceStaysDisabled(t *testing.T) {
	e := relaytest.Start(t, relaytest.Options{Cloudly: func(c *sim.Cloudly) { c.DisableRelay() }})
	e.Eventually("the relay answered the configuration push", func() bool { return e.Cloudly.ConfigPushes() >= 1 })

	n := e.Dial("node-a")
	_, err := n.Register(ctx5(t))
	wantRefusal(t, err, contracts.RelayClusterNotEnabled)
	if got := e.Cloudly.Received(contracts.MethodRegisterPalletRuntimeSession); got != 0 {
		t.Fatalf("the disabled relay forwarded %d node registrations to Cloudly; custody was restored by the attach that preceded the push", got)
	}
}
