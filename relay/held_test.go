package relay_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
)

// TestNoByteOutsideTheBudget: bytes a peer makes the relay hold are charged before they are read
// or queued, and never past a cap (docs/hostile.md, "No byte outside the budget").
func TestNoByteOutsideTheBudget(t *testing.T) {
	t.Run("unfinished request headers are charged, and cut at 16 KiB", func(t *testing.T) {
		e := start(t, relay.Features{})
		const conns = 40
		for i := range conns {
			c := rawTCP(t, e.relay.DownstreamAddr().String())
			// An upgrade request line and a few headers, without the blank line that ends them.
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: relay\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nX-Pad-%d: x\r\n", i)
		}
		e.eventually("every unfinished request's headers charged", func() bool {
			return e.Metric("relay_downstream_budget_used_bytes") >= conns*16<<10
		})
		c := rawTCP(t, e.relay.DownstreamAddr().String())
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: relay\r\n")
		pad := "X-Pad: " + strings.Repeat("p", 1000) + "\r\n"
		go func() {
			for range 64 { // 64 KiB of headers: four times the cap
				if _, err := io.WriteString(c, pad); err != nil {
					return
				}
			}
		}()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("64 KiB of request headers: no answer (%v); the relay still reads them", err)
		}
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("64 KiB of request headers answered %d, want 431", resp.StatusCode)
		}
	})

	t.Run("a node's answers to a Cloudly that reads slowly wait on the node, within its share", func(t *testing.T) {
		const limit = 16 << 20
		x := relaytest.Start(t, relaytest.Options{Configure: func(c *relay.Config) { c.PeerMemoryBytes = limit }})
		e := &env{Env: x, t: t, cloudly: x.Cloudly, relay: x.Relay, cfg: x.Config, logs: x.Logs, url: x.URL}
		stalled, unblock := make(chan struct{}), make(chan struct{})
		e.cloudly.Handle("stallCloudlyReadLoop", func(json.RawMessage) (json.RawMessage, error) {
			close(stalled)
			<-unblock // on Cloudly's read loop: it reads nothing more until released
			return json.RawMessage(`{}`), nil
		})
		released := false
		release := func() {
			if !released {
				released = true
				close(unblock)
			}
		}
		t.Cleanup(release)
		big, honest := e.node("node-big"), e.node("node-honest")
		answer := json.RawMessage(`{"pad":"` + strings.Repeat("a", 1<<20) + `"}`)
		big.Handle("readRuntimeAssignmentStats", func(json.RawMessage) (json.RawMessage, error) { return answer, nil })
		if _, err := honest.Conn().CallAsync("stallCloudlyReadLoop", json.RawMessage(`{"session":{"nodeId":"node-honest"}}`), func(typedsocket.Reply) {}, typedsocket.Timeout(time.Minute)); err != nil {
			t.Fatal(err)
		}
		<-stalled
		stop := make(chan struct{})
		peak := peakOf(e.Env, stop)
		// Answers of 1 MiB, one after another, until the budget is spent: the relay's read of the
		// big node's answer waits for room. What it takes to get there is the budget (16 MiB, less
		// the reserve kept for peers that hold little) and the socket buffers on the way to
		// Cloudly. The next call goes once the relay has read the last answer, or its read waits:
		// no answer more than it takes is made: some 16 of them. (Forty at once, as before, sent
		// the honest node's request below before the budget was spent, and each MiB read past the
		// moment cost the race-detected relay a second or more under load.) Forty MiB, the budget
		// and the buffers on the way by half again, that never got there is a failure.
		const maxCalls = 40
		answered := make(chan error, maxCalls)
		waiting := func() bool { return e.Metric("relay_downstream_budget_waiters") > 0 }
		calls := 0
		for !waiting() {
			if calls == maxCalls {
				t.Fatalf("%d MiB of answers behind a Cloudly that reads nothing, and no read waits for room in the %d MiB budget (%.1f MiB used)",
					calls, limit>>20, e.Metric("relay_downstream_budget_used_bytes")/(1<<20))
			}
			e.cloudly.CallAsync("readRuntimeAssignmentStats", json.RawMessage(`{"session":{"nodeId":"node-big"}}`), func(r typedsocket.Reply) { answered <- r.Err })
			calls++
			e.eventually("the relay read the big node's answer, or its read waits for room", func() bool {
				return e.Metric("relay_downstream_forwarded_requests_total", "direction", "to-node", "outcome", "answered") == float64(calls) || waiting()
			})
		}
		t.Logf("%d answers of 1 MiB spent the budget", calls)
		// The honest node's small request is taken, not refused, while the big node's answers wait.
		outcome := make(chan error, 1)
		if _, err := honest.Conn().CallAsync("reportRuntimeAssignmentObservation", json.RawMessage(`{"session":{"nodeId":"node-honest"}}`), func(r typedsocket.Reply) { outcome <- r.Err }, typedsocket.Timeout(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if _, err := honest.Call(ctxHung(t), "openRuntimeAssignmentExec", json.RawMessage(`{}`)); !errors.Is(err, contracts.RelayMethodLocalOnly) {
			t.Fatalf("probe: %v", err)
		}
		select {
		case err := <-outcome:
			t.Fatalf("while another node's answers wait behind Cloudly, the honest node was refused: %v", err)
		default:
		}
		release()
		for range calls {
			if err := <-answered; err != nil {
				t.Fatalf("an answer of the big node, once Cloudly reads again: %v", err)
			}
		}
		if err := <-outcome; err != nil {
			t.Fatalf("the honest node's request once Cloudly reads again: %v", err)
		}
		close(stop)
		if p := <-peak; p > limit {
			t.Fatalf("the relay held %.1f MiB for its peers; the budget is %d MiB", p/(1<<20), limit>>20)
		}
	})

	t.Run("half-received messages are charged before they are read", func(t *testing.T) {
		const limit = 16 << 20
		// The withheld messages never end, so the pace rule of unregistered connections closes
		// them (2 s for a first message by default) and frees their charge: on a loaded machine
		// before the last of the 100 is sent and the charge can be seen. The slowest pace the
		// flags allow keeps them a minute; time is not what this test is about.
		x := relaytest.Start(t, relaytest.Options{Configure: func(c *relay.Config) {
			c.PeerMemoryBytes = limit
			c.FirstFrameTimeout, c.MinFrameRate = relay.RegisterDeadline, 1<<10
		}})
		e := &env{Env: x, t: t, cloudly: x.Cloudly, relay: x.Relay, cfg: x.Config, logs: x.Logs, url: x.URL}
		honest := e.node("node-honest") // registered before the attack: it keeps its place
		stop := make(chan struct{})
		peak := peakOf(e.Env, stop)
		const size = 65000
		withhold := func(conns int) {
			for range conns {
				c, ok := tryUpgradeRaw(t, e.relay.DownstreamAddr().String())
				if !ok {
					continue // refused: the unregistered connections' half of the budget is spent
				}
				// A text frame announcing size bytes, all but the last of them sent.
				writeFrameHeader(t, c, size)
				if _, err := c.Write(make([]byte, size-1)); err != nil {
					t.Fatal(err)
				}
			}
		}
		withhold(100) // 6.2 MiB of withheld messages
		e.eventually("the withheld messages' bytes charged", func() bool {
			return e.Metric("relay_downstream_budget_used_bytes") >= 100*(size-1)
		})
		withhold(200) // 12.4 MiB more: past the budget
		close(stop)
		if p := <-peak; p > limit {
			t.Fatalf("the relay held %.1f MiB for its peers; the budget is %d MiB", p/(1<<20), limit>>20)
		}
		// The registered node is carried all the same.
		if _, err := honest.Report(ctxHung(t), "reportRuntimeAssignmentObservation", nil); err != nil {
			t.Fatalf("a registered node among withheld messages: %v", err)
		}
	})

	t.Run("past the descriptor cap the oldest unregistered connection goes first", func(t *testing.T) {
		const max = 24
		x := relaytest.Start(t, relaytest.Options{MaxConnections: max,
			// Past three quarters of the cap, one address's bucket would close them at accept first.
			Configure: func(c *relay.Config) { c.UpgradeBurstPerSource = 1 << 20 }})
		e := &env{Env: x, t: t, cloudly: x.Cloudly, relay: x.Relay, cfg: x.Config, logs: x.Logs, url: x.URL}
		registered := e.node("node-registered")
		var idle []net.Conn
		for range 2 * max {
			idle = append(idle, rawTCP(t, e.relay.DownstreamAddr().String()))
		}
		e.eventually("connections closed to keep the cap", func() bool {
			return e.Metric("relay_downstream_unregistered_closed_total", "reason", "descriptors-oldest") >= max
		})
		// The oldest idle connections were closed, the registered node kept.
		idle[0].SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := idle[0].Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			t.Fatalf("the oldest idle connection is still open past the cap: %v", err)
		}
		if _, err := registered.Report(ctxHung(t), "reportRuntimeAssignmentObservation", nil); err != nil {
			t.Fatalf("a registered node past the cap: %v", err)
		}
		// An honest node arriving past the cap is carried.
		if _, err := e.node("node-late").Report(ctxHung(t), "reportRuntimeAssignmentObservation", nil); err != nil {
			t.Fatalf("an honest node arriving past the cap: %v", err)
		}
	})
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// rawTCP dials addr and closes the connection when the test ends.
func rawTCP(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// tryUpgradeRaw opens a WebSocket to the relay by hand and returns its TCP connection, for frames
// no client library would send; false when the relay refused the upgrade.
func tryUpgradeRaw(t *testing.T, addr string) (net.Conn, bool) {
	t.Helper()
	c := rawTCP(t, addr)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: relay\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		return nil, false
	}
	if br.Buffered() > 0 {
		t.Fatal("bytes after the upgrade answer")
	}
	c.SetReadDeadline(time.Time{})
	return c, true
}

// writeFrameHeader writes the header of one masked, final text frame of n bytes (RFC 6455 §5.2),
// with a zero masking key so the payload goes as is.
func writeFrameHeader(t *testing.T, c net.Conn, n int) {
	t.Helper()
	h := []byte{0x81, 0x80 | 127}
	h = binary.BigEndian.AppendUint64(h, uint64(n))
	h = append(h, 0, 0, 0, 0)
	if n < 1<<16 {
		h = []byte{0x81, 0x80 | 126, byte(n >> 8), byte(n), 0, 0, 0, 0}
	}
	if _, err := c.Write(h); err != nil {
		t.Fatal(err)
	}
}
