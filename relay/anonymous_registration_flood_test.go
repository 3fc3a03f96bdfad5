package relay_test

import (
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
)

// SPEC §2 keeps a connection that has not registered to 64 KiB "so an anonymous peer cannot make
// the relay hold large buffers". Registrations are the one thing such a connection may send, and
// each is forwarded to Cloudly and held (its body with it) until Cloudly answers, for up to the
// 60 s call timeout. Without a bound of its own, an anonymous connection keeps up to the in-flight
// limit (256) of them at once: 16 MiB held per connection, 256 frames of the one upstream socket,
// and 256 bearer checks queued at Cloudly — from anyone who can reach the downstream port.
func TestAnonymousConnectionCannotPileRegistrationsOnCloudly(t *testing.T) {
	e := start(t, relay.Features{})
	release := make(chan struct{})
	var atCloudly atomic.Int64
	e.cloudly.HandleAsync(contracts.MethodRegisterPalletRuntimeSession, func(_ json.RawMessage, reply func(json.RawMessage, error)) {
		atCloudly.Add(1)
		go func() {
			<-release
			reply(nil, &typedsocket.Error{Text: "bearer-refused: the bearer is not the node's current credential", Data: json.RawMessage("null")})
		}()
	})
	t.Cleanup(func() { close(release) }) // runs before the relay's shutdown

	anon := newNode(t, e, "node-anon")
	anon.Bearer = "bearer-guessed"
	var reg map[string]any
	if err := json.Unmarshal(anon.RegistrationBody(), &reg); err != nil {
		t.Fatal(err)
	}
	reg["pad"] = strings.Repeat("x", 60<<10) // under the 64 KiB limit of an unregistered connection
	body := mustJSON(reg)

	const sent = 64
	var busy, other atomic.Int64
	for range sent {
		err := anon.Conn().CallAsync(contracts.MethodRegisterPalletRuntimeSession, body, time.Minute, func(r typedsocket.Reply) {
			if errors.Is(r.Err, contracts.RelayNodeBusy) {
				busy.Add(1)
			} else {
				other.Add(1)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	e.eventually("every registration is at Cloudly or refused relay-node-busy", func() bool {
		return atCloudly.Load()+busy.Load() == sent
	})
	if n := atCloudly.Load(); n > relay.MaxRegistrationsInFlight {
		t.Errorf("one anonymous connection holds %d registrations of %d KiB at Cloudly at once; want at most %d",
			n, len(body)>>10, relay.MaxRegistrationsInFlight)
	}
	if other.Load() != 0 {
		t.Errorf("%d registrations answered before Cloudly did", other.Load())
	}
}
