package sim

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/testenv/await"
)

// Two relays attached to one cluster at once is what docs/ha.md forbids: the stand-in judges it.
// A registration accepted while another accepted socket is open counts, and is a violation; one
// accepted after that socket has closed does not.
func TestSimCloudlyCountsTwoAttachedAtOnce(t *testing.T) {
	c, err := NewCloudly(zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	attach := func(seq int64) *typedsocket.Conn {
		conn := dialCloudly(t, c)
		if _, err := conn.Call(ctx, contracts.MethodRegisterCloudlyClientSession, contracts.EncodeCloudlyClientSessionRequest(contracts.RelayOffer, contracts.NewSecret(c.Token))); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Call(ctx, contracts.MethodRegisterClusterRelay, registration(seq)); err != nil {
			t.Fatal(err)
		}
		return conn
	}
	first := attach(0)
	if c.TwoAttached() != 0 || len(c.Violations()) != 0 || c.AttachedSockets() != 1 {
		t.Fatalf("one relay: twoAttached %d, sockets %d, violations %q", c.TwoAttached(), c.AttachedSockets(), c.Violations())
	}
	second := attach(1)
	if c.TwoAttached() != 1 || c.AttachedSockets() != 2 {
		t.Fatalf("two relays: twoAttached %d, sockets %d", c.TwoAttached(), c.AttachedSockets())
	}
	if v := c.Violations(); len(v) != 1 || !strings.Contains(v[0], "two relays attached at once") {
		t.Fatalf("violations %q", v)
	}
	first.CloseNow()
	second.CloseNow()
	<-first.Done()
	<-second.Done()
	// Cloudly's side of the two sockets ends a moment later.
	await.Until(t, "Cloudly to count no closed socket as attached", 10*time.Second, func() bool { return c.AttachedSockets() == 0 })
	attach(2)
	if c.TwoAttached() != 1 || c.AttachedSockets() != 1 {
		t.Fatalf("after both closed: twoAttached %d, sockets %d", c.TwoAttached(), c.AttachedSockets())
	}
}
