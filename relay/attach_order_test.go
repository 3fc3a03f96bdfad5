package relay_test

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/escrow"
	"code.foss.global/serve.zone/relay/internal/relaytest"
	"code.foss.global/serve.zone/relay/internal/sim"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
)

// A request Cloudly sends right after accepting the relay's registration must be served as coming
// from the attached session. The relay reads it on the socket's read loop before the session
// goroutine has recorded the attachment, and escrow refused it as not from Cloudly.
func TestRequestRightAfterAcceptedRegistrationIsFromTheAttachedSession(t *testing.T) {
	esc, err := escrow.New(escrow.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var answers []error
	e := relaytest.Start(t, relaytest.Options{Features: relay.Features{Escrow: esc}, Cloudly: func(c *sim.Cloudly) {
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
}
