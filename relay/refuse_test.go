package relay_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// upgradeFrom opens a WebSocket by hand from the local address from; false when the relay
// refused or closed it before the upgrade's answer. It is closed when the test ends.
func upgradeFrom(t *testing.T, e *env, from string) (net.Conn, bool) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", e.relay.DownstreamAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: relay\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 512), nil)
	c.SetReadDeadline(time.Time{})
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		return nil, false
	}
	return c, true
}

// sendObservation writes a whole request that is not a registration.
func sendObservation(t *testing.T, c net.Conn) {
	t.Helper()
	req := []byte(`{"method":"reportRuntimeAssignmentObservation","correlation":{"id":"o1","phase":"request"},"request":{}}`)
	writeFrameHeader(t, c, len(req))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
}

// TestRefuseBeforeWorking: under load (the unregistered half of the budget past three quarters) a
// connection the relay will refuse costs it little: past its address's token bucket it is closed
// at accept; one whose first message is not a registration is closed without an answer or a close
// handshake. With every peer on one address (--max-unregistered-per-source 0) an honest node that
// connected before is still registered within 2 s.
func TestRefuseBeforeWorking(t *testing.T) {
	t.Run("under load, every peer on one address", func(t *testing.T) {
		e := startPaced(t, func(c *relay.Config) { c.FirstFrameTimeout = relay.RegisterDeadline })
		honest := sim.NewNode("node-honest", zerolog.Nop())
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := honest.Connect(ctx, e.url); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(honest.Close)

		// Half-sent messages from one address until the relay closes a connection at accept: past
		// three quarters of the unregistered half (about 140 of them), 127.0.0.1's burst of 16
		// is all it admits.
		conns := halfFrames(t, e, 400, 400)
		t.Logf("%d anonymous connections admitted before the bucket closed one", len(conns))
		if len(conns) >= 186 {
			t.Fatalf("%d connections with half-sent messages admitted from one address: the unregistered half filled without a bucket", len(conns))
		}
		if n := e.Metric("relay_downstream_unregistered_closed_total", "reason", "rate"); n < 1 {
			t.Fatalf(`no connection closed at accept with reason "rate" (%v)`, n)
		}
		refused := 0
		for range 50 {
			if _, ok := upgradeFrom(t, e, "127.0.1.1"); !ok {
				refused++
			}
		}
		if refused < 40 {
			t.Errorf("under load, %d of 50 upgrades from one address refused; its bucket admits 4 a second", refused)
		}

		// Another address has a bucket of its own; its first message is not a registration, and
		// the connection is closed without an answer and without a close frame.
		c, ok := upgradeFrom(t, e, "127.0.0.2")
		if !ok {
			t.Fatal("an upgrade from another address refused")
		}
		sendObservation(t, c)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var b [256]byte
		n, err := c.Read(b[:])
		if err == nil || isTimeout(err) {
			t.Fatalf("a first message that is not a registration: the connection stays open (read %q, %v)", b[:n], err)
		}
		if n != 0 {
			t.Errorf("the relay sent %q before closing; under load it answers nothing and skips the close handshake", b[:n])
		}
		if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "not-registration"); got != 1 {
			t.Errorf(`relay_downstream_unregistered_closed_total{reason="not-registration"} = %v, want 1`, got)
		}

		// The one wait of this test that is its subject.
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer rcancel()
		if _, err := honest.Register(rctx); err != nil {
			t.Fatalf("the honest node's registration under load: %v", err)
		}
		if n := e.cloudly.NodeRegistrations("node-honest"); n != 1 {
			t.Fatalf("Cloudly saw %d registrations of the honest node", n)
		}
	})

	t.Run("without load, nothing of this", func(t *testing.T) {
		e := startPaced(t, nil)
		for i := range 2 * relay.DefaultUpgradeBurstPerSource {
			if _, ok := upgradeFrom(t, e, "127.0.0.1"); !ok {
				t.Fatalf("upgrade %d from one address refused without load", i+1)
			}
		}
		c, ok := upgradeFrom(t, e, "127.0.0.1")
		if !ok {
			t.Fatal("upgrade refused")
		}
		sendObservation(t, c)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var b [2]byte
		if _, err := c.Read(b[:]); err != nil {
			t.Fatalf("without load a first message that is not a registration is answered; read: %v", err)
		}
		if b[0] != 0x81 {
			t.Fatalf("the first frame back is %#x, want a text frame (the answer)", b[0])
		}
		if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "not-registration"); got != 0 {
			t.Errorf(`relay_downstream_unregistered_closed_total{reason="not-registration"} = %v without load`, got)
		}
	})
}
