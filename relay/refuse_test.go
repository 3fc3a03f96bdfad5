package relay_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
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
	sendFrame(t, c, []byte(`{"method":"reportRuntimeAssignmentObservation","correlation":{"id":"o1","phase":"request"},"request":{}}`))
}

// sendFrame writes msg as one whole text message.
func sendFrame(t *testing.T, c net.Conn, msg []byte) {
	t.Helper()
	writeFrameHeader(t, c, len(msg))
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
}

// registrationFrame is a node's registration request, as an honest node of that name sends it.
func registrationFrame(node string) []byte {
	return fmt.Appendf(nil, `{"method":%q,"correlation":{"id":"r1","phase":"request"},"request":%s}`,
		contracts.MethodRegisterPalletRuntimeSession, sim.NewNode(node, zerolog.Nop()).RegistrationBody())
}

// readTextFrame reads one unmasked text frame of the relay's, shorter than 64 KiB.
func readTextFrame(br *bufio.Reader) ([]byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return nil, err
	}
	if h[0] != 0x81 {
		return nil, fmt.Errorf("a frame of type %#x, not a whole text frame", h[0])
	}
	n := int(h[1])
	if n == 126 {
		var ext [2]byte
		if _, err := io.ReadFull(br, ext[:]); err != nil {
			return nil, err
		}
		n = int(ext[0])<<8 | int(ext[1])
	}
	b := make([]byte, n)
	_, err := io.ReadFull(br, b)
	return b, err
}

// expectClosedUnanswered waits for the relay to close c after what, and fails if it wrote anything
// first: under load an unregistered connection's refused message is neither answered nor given a
// close handshake.
func expectClosedUnanswered(t *testing.T, c net.Conn, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [256]byte
	n, err := c.Read(b[:])
	if err == nil || isTimeout(err) {
		t.Fatalf("%s: the connection stays open (read %q, %v)", what, b[:n], err)
	}
	if n != 0 {
		t.Errorf("%s: the relay sent %q before closing; under load it answers nothing and skips the close handshake", what, b[:n])
	}
}

// TestRefuseBeforeWorking: under load (the unregistered half of the budget past three quarters) a
// connection the relay will refuse costs it little: past its address's token bucket it is closed
// at accept; one that sends anything but a registration the relay would forward — a first message
// that is not a registration, a malformed one, a second registration while the first is at
// Cloudly — is closed without an answer or a close handshake. With every peer on one address
// (--max-unregistered-per-source 0) an honest node that connected before is still registered
// within 2 s. Without load the relay answers an unregistered connection's refused requests by
// name, RefusedUnregisteredBurst at once, and closes it at one more sent before a second has
// passed; it closes it at once at a message that is no request at all.
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
		expectClosedUnanswered(t, c, "a first message that is not a registration")
		if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "not-registration"); got != 1 {
			t.Errorf(`relay_downstream_unregistered_closed_total{reason="not-registration"} = %v, want 1`, got)
		}

		// Not only the first message: a malformed one (without load answered relay-request-invalid)
		// is not a registration either.
		c, ok = upgradeFrom(t, e, "127.0.0.3")
		if !ok {
			t.Fatal("an upgrade from a third address refused")
		}
		sendFrame(t, c, []byte(`{"method":"x","correlation":{"id":"m1","phase":"request"},"request":0}`))
		expectClosedUnanswered(t, c, "a malformed request")
		if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "not-registration"); got != 2 {
			t.Errorf(`relay_downstream_unregistered_closed_total{reason="not-registration"} = %v, want 2`, got)
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

		// A registration sent while the connection's last one is still at Cloudly: closed, the
		// first one's answer never given. Cloudly holds the first one's answer meanwhile.
		held := make(chan func(json.RawMessage, error), 1)
		e.cloudly.HandleAsync(contracts.MethodRegisterPalletRuntimeSession, func(_ json.RawMessage, reply func(json.RawMessage, error)) { held <- reply })
		c, ok = upgradeFrom(t, e, "127.0.0.4")
		if !ok {
			t.Fatal("an upgrade from a fourth address refused")
		}
		registration := registrationFrame("node-flooder")
		sendFrame(t, c, registration)
		var reply func(json.RawMessage, error)
		select {
		case reply = <-held:
		case <-time.After(10 * time.Second):
			t.Fatal("Cloudly never had the first registration")
		}
		defer reply(nil, contracts.RelayNodeBusy.Refuse("test ends"))
		sendFrame(t, c, registration)
		expectClosedUnanswered(t, c, "a second registration while the first is at Cloudly")
		if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "registrations"); got != 1 {
			t.Errorf(`relay_downstream_unregistered_closed_total{reason="registrations"} = %v, want 1`, got)
		}
	})

	t.Run("without load, refusals answered at a pace, faster closed; junk closed at once", func(t *testing.T) {
		// The pace is judged on a clock that stands still: however slowly a busy machine reads
		// the messages, they all arrive within the same second.
		e := startPacedAt(t, nil, newTestClock(time.Now()).Now)
		for i := range 2 * relay.DefaultUpgradeBurstPerSource {
			if _, ok := upgradeFrom(t, e, "127.0.0.1"); !ok {
				t.Fatalf("upgrade %d from one address refused without load", i+1)
			}
		}
		c, ok := upgradeFrom(t, e, "127.0.0.1")
		if !ok {
			t.Fatal("upgrade refused")
		}
		br := bufio.NewReader(c)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		// The burst is answered, the one after it closes the connection.
		for range relay.RefusedUnregisteredBurst + 1 {
			sendObservation(t, c)
		}
		for i := range relay.RefusedUnregisteredBurst {
			answer, err := readTextFrame(br)
			if err != nil {
				t.Fatalf("without load, message %d that is not a registration is answered; read: %v", i+1, err)
			}
			if !strings.Contains(string(answer), string(contracts.RelaySessionForeign)) {
				t.Fatalf("answer %d is %s, want %s", i+1, answer, contracts.RelaySessionForeign)
			}
		}
		if answer, err := readTextFrame(br); err == nil {
			t.Fatalf("message %d that is not a registration, at once, is answered %s; the relay answers %d at once and then closes", relay.RefusedUnregisteredBurst+1, answer, relay.RefusedUnregisteredBurst)
		}
		if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "refusals"); got != 1 {
			t.Errorf(`relay_downstream_unregistered_closed_total{reason="refusals"} = %v, want 1`, got)
		}
		if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "not-registration"); got != 0 {
			t.Errorf(`relay_downstream_unregistered_closed_total{reason="not-registration"} = %v without load`, got)
		}

		// One registration at a time: the second and third, sent while the first is at Cloudly, are
		// refused relay-node-busy (refused requests, answered two at once), the fourth closes the
		// connection.
		held := make(chan func(json.RawMessage, error), 1)
		e.cloudly.HandleAsync(contracts.MethodRegisterPalletRuntimeSession, func(_ json.RawMessage, reply func(json.RawMessage, error)) { held <- reply })
		c, ok = upgradeFrom(t, e, "127.0.0.1")
		if !ok {
			t.Fatal("upgrade refused")
		}
		br = bufio.NewReader(c)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		registration := registrationFrame("node-pipelining")
		sendFrame(t, c, registration)
		var reply func(json.RawMessage, error)
		select {
		case reply = <-held:
		case <-time.After(10 * time.Second):
			t.Fatal("Cloudly never had the first registration")
		}
		defer reply(nil, contracts.RelayNodeBusy.Refuse("test ends"))
		for range relay.RefusedUnregisteredBurst + 1 {
			sendFrame(t, c, registration)
		}
		for range relay.RefusedUnregisteredBurst {
			if answer, err := readTextFrame(br); err != nil || !strings.Contains(string(answer), string(contracts.RelayNodeBusy)) {
				t.Fatalf("another registration while the first is at Cloudly: %s, %v; want %s", answer, err, contracts.RelayNodeBusy)
			}
		}
		if answer, err := readTextFrame(br); err == nil {
			t.Fatalf("registration %d while the first is at Cloudly is answered %s; the relay closes the connection", relay.RefusedUnregisteredBurst+2, answer)
		}
		if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "refusals"); got != 2 {
			t.Errorf(`relay_downstream_unregistered_closed_total{reason="refusals"} = %v, want 2`, got)
		}
		if n := e.cloudly.Received(contracts.MethodRegisterPalletRuntimeSession); n != 1 {
			t.Errorf("Cloudly received %d registrations of the connection, want 1", n)
		}

		// A message that is no request at all (here one that does not decode) closes it at once.
		c, ok = upgradeFrom(t, e, "127.0.0.1")
		if !ok {
			t.Fatal("upgrade refused")
		}
		sendFrame(t, c, []byte(`{"method":"x","correlation":{"id":"m1","phase":"request"},"request":0}`))
		expectClosedUnanswered(t, c, "a malformed first message without load")
		if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "not-registration"); got != 1 {
			t.Errorf(`relay_downstream_unregistered_closed_total{reason="not-registration"} = %v, want 1`, got)
		}
	})
}
