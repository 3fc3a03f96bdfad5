package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// flood writes frame over and over on ws without ever reading, until a write fails or limit
// bytes are sent, and returns what it sent.
func flood(ws *websocket.Conn, frame []byte, limit int) (int, error) {
	sent := 0
	for sent < limit {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := ws.Write(ctx, websocket.MessageText, frame)
		cancel()
		if err != nil {
			return sent, err
		}
		sent += len(frame)
	}
	return sent, nil
}

// peakOf samples the relay's budget until stop is closed and returns the highest value seen.
func peakOf(e *relaytest.Env, stop <-chan struct{}) <-chan float64 {
	out := make(chan float64, 1)
	go func() {
		peak := 0.0
		for {
			peak = max(peak, e.Metric("relay_downstream_budget_used_bytes"))
			select {
			case <-stop:
				out <- peak
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return out
}

// TestPeerMemoryBudget: every byte the relay holds for a downstream peer is charged to one budget
// (docs/hostile.md); a peer that sends and reads nothing is closed, and the budget comes back to zero.
func TestPeerMemoryBudget(t *testing.T) {
	t.Run("an anonymous peer sending malformed requests and reading nothing is closed", func(t *testing.T) {
		e := start(t, relay.Features{})
		ws, _, err := websocket.Dial(ctxHung(t), e.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.CloseNow()
		frame := []byte(`{"method":"m","request":0,"correlation":{"id":"x","phase":"request"}}`)
		stop := make(chan struct{})
		peak := peakOf(e.Env, stop)
		sent, err := flood(ws, frame, 92<<20)
		close(stop)
		if err == nil {
			t.Fatalf("sent %d MiB of malformed requests without reading, and the relay never closed the connection", sent>>20)
		}
		if sent > 16<<20 {
			t.Fatalf("the relay closed the connection only after %d MiB", sent>>20)
		}
		if p := <-peak; p > 4<<20 {
			t.Fatalf("the relay held %.1f MiB for one anonymous peer", p/(1<<20))
		}
		e.eventually("the budget back to zero", func() bool { return e.Metric("relay_downstream_budget_used_bytes") == 0 })
	})

	t.Run("what all peers hold is bounded, the heaviest non-reader evicted first", func(t *testing.T) {
		const limit = 16 << 20
		x := relaytest.Start(t, relaytest.Options{Configure: func(c *relay.Config) { c.PeerMemoryBytes = limit }})
		e := &env{Env: x, t: t, cloudly: x.Cloudly, relay: x.Relay, cfg: x.Config, logs: x.Logs, url: x.URL}
		// 3 greedy nodes × 256 requests in flight × 48 KiB answers: 36 MiB, more than the budget
		// and the kernel's socket buffers of three connections that read nothing together, by
		// half again: the relay evicts two of them (RELAY_FAULTS=long: 6 greedy nodes, 72 MiB).
		answer := json.RawMessage(`{"pad":"` + strings.Repeat("a", 48<<10) + `"}`)
		e.cloudly.Handle("readLargeThing", func(json.RawMessage) (json.RawMessage, error) { return answer, nil })
		honest := e.node("node-honest")
		stop := make(chan struct{})
		peak := peakOf(e.Env, stop)
		var wg sync.WaitGroup
		greedy := make([]*rawNode, sized(3, 6))
		for i := range greedy {
			greedy[i] = dialRaw(t, e, fmt.Sprintf("node-greedy-%d", i))
		}
		for i, n := range greedy {
			frame := []byte(`{"method":"readLargeThing","request":{"session":{"nodeId":"` + fmt.Sprintf("node-greedy-%d", i) +
				`"}},"correlation":{"id":"g","phase":"request"}}`)
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Twice the 256 in flight whose answers fill the budget: the relay refuses the
				// rest relay-node-busy, and each refusal costs this shared machine's CPU and
				// proves nothing more.
				flood(n.ws, frame, 2*256*len(frame))
			}()
		}
		// Meanwhile an honest node that reads its answers is carried: 20 requests (long: 50)
		// answered, never refused nor closed. Its first answers wait behind the greedy nodes'
		// burst at Cloudly, as long as a busy machine takes to move it; only a hang ends the wait.
		ctx := ctxHung(t)
		for i := range sized(20, 50) {
			_, err := honest.Report(ctx, "readLargeThing", map[string]any{"i": i})
			if err != nil {
				t.Fatalf("honest request %d: %v", i, err)
			}
		}
		wg.Wait()
		close(stop)
		if p := <-peak; p > limit+8<<20 {
			t.Fatalf("the relay held %.1f MiB for its peers; the budget is %d MiB", p/(1<<20), limit>>20)
		}
		e.eventually("a greedy peer evicted", func() bool { return e.Metric("relay_downstream_budget_evictions_total") > 0 })
		if _, err := honest.Report(ctx, "readLargeThing", nil); err != nil {
			t.Fatalf("the honest node after the flood: %v", err)
		}
	})

	// A node's request stays in flight until Cloudly answers (up to the 60 s call timeout), and the
	// node may have 256 of them, each up to --max-message-bytes (8 MiB). Once a request's frame has
	// been written upstream the relay needs nothing of its body; keeping it would let one registered
	// node make the relay hold 256 × 8 MiB = 2 GiB for a minute (and every node as much), outside
	// every queue bound (decisions.md "Limits and timing" bounds queued frames and answers only).
	// Twelve bodies of 256 KiB held would grow the heap by 3 MiB, three times the bound; the
	// relay that holds none grows it by some 12 KiB (RELAY_FAULTS=long: 1 MiB bodies).
	t.Run("forwarded request bodies are not held while Cloudly thinks", func(t *testing.T) {
		e := start(t, relay.Features{})
		const method = "reportRuntimeAssignmentLogs"
		const count = 12
		size := sized(256<<10, 1<<20) // bodies held would show as 3 MiB, the bound is 1 (long: 12, 4)
		release, allAtCloudly := make(chan struct{}), make(chan struct{})
		var atCloudly atomic.Int64
		e.cloudly.HandleAsync(method, func(_ json.RawMessage, reply func(json.RawMessage, error)) {
			if atCloudly.Add(1) == count {
				close(allAtCloudly)
			}
			go func() { <-release; reply(json.RawMessage(`{}`), nil) }()
		})
		t.Cleanup(func() { close(release) })
		n := e.node("node-a")

		body := []byte(`{"session":{"nodeId":"node-a"},"logs":"` + strings.Repeat("x", size) + `"}`)
		before := heapInUse()
		for range count {
			for {
				_, err := n.Conn().CallAsync(method, body, func(typedsocket.Reply) {}, typedsocket.Timeout(time.Minute))
				if err == nil {
					break
				}
				if !errors.Is(err, typedsocket.ErrQueueFull) {
					t.Fatal(err)
				}
				e.eventually("the node's own send queue drained", func() bool { return n.Conn().QueueLen() == 0 })
			}
		}
		select {
		case <-allAtCloudly:
		case <-time.After(hungAfter):
			t.Fatalf("%d of %d requests reached Cloudly in %s", atCloudly.Load(), count, hungAfter)
		}
		held := int64(heapInUse()) - int64(before)
		if held > int64(count*size/3) {
			t.Errorf("with %d requests of %d KiB in flight at Cloudly the heap grew by %d KiB: the relay holds their bodies", count, size>>10, held>>10)
		}
	})

	// One socket carries the whole cluster to Cloudly, and its send queue (65 536 frames, 256 MiB,
	// decisions.md "Limits and timing") is shared first come, first served. When Cloudly's socket
	// drains slower than nodes send — a WAN link, or Cloudly busy — one registered node sending
	// max-size messages (each up to --max-message-bytes, 8 MiB; 256 in flight) fills all of it, and
	// every other node is refused relay-upstream-busy. docs/protocol.md#node-runtime-sessions: "A slow node never delays another
	// node or Cloudly's socket"; a flooding node must not either. Here Cloudly stops reading for a
	// while; the flooder sends until the relay refuses it, with ever smaller messages; then an honest
	// node's log batch must still be taken. The share and the message bound are a thirty-second of
	// the defaults' (1 MiB, 256 KiB), as is the batch: the same rule, filled with megabytes less
	// (with an eighth, and the requests sent ahead, the three floods sent some 28 MiB; now 5).
	// RELAY_FAULTS=long: an eighth (4 MiB, 1 MiB).
	t.Run("one node cannot take the whole upstream queue", func(t *testing.T) {
		// Cloudly reads nothing for as long as the flood takes, which on a busy machine can pass
		// the 45 s after which either side takes a silent peer for gone, and a ping of the relay's
		// to the flooder, whose writes wait, would end its connection five seconds later. Neither
		// is what this test is about: neither side pings or gives up on silence here, nor does the
		// relay time out the requests it holds.
		part := sized(32, 8)
		share, maxMessage := relay.RegisteredShare/int64(part), relay.DefaultMaxMessageBytes/part
		x := relaytest.Start(t, relaytest.Options{PingInterval: time.Hour, DeadTimeout: time.Hour, CallTimeout: time.Hour,
			RegisteredShare: share, Configure: func(c *relay.Config) { c.MaxMessageBytes = int64(maxMessage) },
			Cloudly: func(c *sim.Cloudly) { c.SetDeadTimeout(time.Hour) }})
		e := &env{Env: x, t: t, cloudly: x.Cloudly, relay: x.Relay, cfg: x.Config, logs: x.Logs, url: x.URL}
		stalled, unblock := make(chan struct{}), make(chan struct{})
		e.cloudly.Handle("stallCloudlyReadLoop", func(json.RawMessage) (json.RawMessage, error) {
			close(stalled)
			<-unblock // on Cloudly's read loop: it reads nothing more until released
			return json.RawMessage(`{}`), nil
		})
		var once atomic.Bool
		release := func() {
			if once.CompareAndSwap(false, true) {
				close(unblock)
			}
		}
		t.Cleanup(release)
		honest := e.node("node-honest")
		flooder := e.node("node-flooder")
		if _, err := honest.Conn().CallAsync("stallCloudlyReadLoop", json.RawMessage(`{"session":{"nodeId":"node-honest"}}`), func(typedsocket.Reply) {}, typedsocket.Timeout(time.Minute)); err != nil {
			t.Fatal(err)
		}
		<-stalled

		const method = "reportRuntimeAssignmentLogs"
		for _, size := range []int{maxMessage - 1024, 64 << 10, 1 << 10} {
			floodUntilRefused(t, e, flooder, method, size)
		}

		outcome := make(chan error, 1)
		batch := []byte(`{"session":{"nodeId":"node-honest"},"logs":"` + strings.Repeat("y", maxMessage/8) + `"}`)
		if _, err := honest.Conn().CallAsync(method, batch, func(r typedsocket.Reply) { outcome <- r.Err }, typedsocket.Timeout(time.Minute)); err != nil {
			t.Fatal(err)
		}
		// The relay serves a connection's requests in order and answers this one itself: once its
		// answer is back, the batch has been queued upstream or refused, and a refusal read first.
		if _, err := honest.Call(ctxHung(t), "openRuntimeAssignmentExec", json.RawMessage(`{}`)); !errors.Is(err, contracts.RelayMethodLocalOnly) {
			t.Fatalf("probe: %v", err)
		}
		select {
		case err := <-outcome:
			t.Fatalf("while one node floods, the honest node's log batch was refused: %v", err)
		default:
		}
		release()
		if err := <-outcome; err != nil {
			t.Fatalf("honest batch once Cloudly reads again: %v", err)
		}
	})
}

// TestBudgetComesBackToZero drives every path that releases a charge — answers written and
// dropped, requests to a node written and dropped, node requests written to Cloudly and dropped
// with Cloudly's socket, stream frames both ways, registrations answered and lost — and checks
// that the budget returns to exactly zero and never released a byte it did not charge.
func TestBudgetComesBackToZero(t *testing.T) {
	e := start(t, relay.Features{})
	ctx := ctxHung(t)
	a, b := e.node("node-a"), e.node("node-b")
	// Answers written; node → Cloudly requests written; Cloudly → node requests written.
	for i := range 20 {
		if _, err := a.Report(ctx, "reportRuntimeAssignmentObservation", map[string]any{"i": i}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.cloudly.Call(ctx, "readRuntimeAssignmentStats", json.RawMessage(`{"session":{"nodeId":"node-b"}}`)); err != nil {
			t.Fatal(err)
		}
	}
	// Stream frames both ways: 100 KiB in four chunks each way (RELAY_FAULTS=long: 300 KiB in
	// five); every chunk is charged and released as the first is.
	image, chunk := make([]byte, sized(100<<10, 300<<10)), sized(32<<10, 64<<10)
	if err := a.PushImage(ctx, image, chunk); err != nil {
		t.Fatal(err)
	}
	if err := e.cloudly.PushImage(ctx, "node-b", image, chunk); err != nil {
		t.Fatal(err)
	}
	// Requests to a node that never reads them, dropped when it goes; answers dropped with it.
	stalled := dialRaw(t, e, "node-stalled")
	for range 50 {
		e.cloudly.CallAsync("applyRuntimeAssignment", json.RawMessage(`{"session":{"nodeId":"node-stalled"},"pad":"`+strings.Repeat("p", 32<<10)+`"}`), func(typedsocket.Reply) {})
	}
	refused := e.Metric("relay_downstream_refusals_total", "name", string(contracts.RelayMethodLocalOnly))
	stalled.ws.Write(ctx, websocket.MessageText, []byte(`{"method":"m","request":0,"correlation":{"id":"x","phase":"request"}}`))
	stalled.ws.Write(ctx, websocket.MessageText, []byte(`{"method":"openRuntimeAssignmentExec","request":{},"correlation":{"id":"y","phase":"request"}}`))
	// Where the close must find the malformed request: read and refused, its answer queued behind
	// the fifty requests the node never reads (the relay reads a connection's messages in order
	// and refuses the next one itself: once it has, it has read this one), or its read waiting for
	// room in the budget.
	e.eventually("the stalled node's requests read, or a read waiting for budget", func() bool {
		return e.Metric("relay_downstream_refusals_total", "name", string(contracts.RelayMethodLocalOnly)) > refused ||
			e.Metric("relay_downstream_budget_waiters") > 0
	})
	stalled.ws.CloseNow()
	// Node requests queued to Cloudly while it reads nothing, dropped with its socket.
	hold, stalling := make(chan struct{}), make(chan struct{})
	e.cloudly.Handle("stallCloudlyReadLoop", func(json.RawMessage) (json.RawMessage, error) {
		close(stalling)
		<-hold
		return json.RawMessage(`{}`), nil
	})
	a.Conn().CallAsync("stallCloudlyReadLoop", json.RawMessage(`{"session":{"nodeId":"node-a"}}`), func(typedsocket.Reply) {}, typedsocket.Timeout(time.Minute))
	// The batches go once Cloudly's read loop stands still: sent before, on a busy machine some
	// were answered ahead of the stalling call and the twenty were never pending at once.
	e.eventually("the stalling call at Cloudly", func() bool {
		select {
		case <-stalling:
			return true
		default:
			return false
		}
	})
	for range 20 {
		b.Conn().CallAsync("reportRuntimeAssignmentLogs", json.RawMessage(`{"session":{"nodeId":"node-b"},"logs":"`+strings.Repeat("l", 256<<10)+`"}`), func(typedsocket.Reply) {}, typedsocket.Timeout(time.Minute))
	}
	// A registration in flight at Cloudly when its socket goes.
	lost := newNode(t, e, "node-lost")
	// The stalling call and the twenty batches are pending at Cloudly: once one more is, the
	// registration is queued to it or sent.
	e.eventually("the twenty batches pending at Cloudly", func() bool { return e.Metric("relay_upstream_pending_calls") == 21 })
	lost.Conn().CallAsync(contracts.MethodRegisterPalletRuntimeSession, lost.RegistrationBody(), func(typedsocket.Reply) {}, typedsocket.Timeout(time.Minute))
	e.eventually("the registration pending at Cloudly", func() bool { return e.Metric("relay_upstream_pending_calls") == 22 })
	go e.cloudly.Drop()
	close(hold)
	// A registration answered (refused) once Cloudly is back.
	e.WaitAttached()
	anon := newNode(t, e, "node-anon")
	anon.Bearer = "wrong"
	if _, err := anon.Register(ctx); err == nil {
		t.Fatal("a wrong bearer was accepted")
	}
	anon.Close()
	lost.Close()
	for _, n := range []interface{ Close() }{a, b} {
		n.Close()
	}
	e.eventually("the budget back to exactly zero", func() bool { return e.Metric("relay_downstream_budget_used_bytes") == 0 })
	if u := e.Metric("relay_downstream_budget_underflows_total"); u != 0 {
		t.Fatalf("%v releases of bytes never charged", u)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// floodUntilRefused sends size-byte requests from n without waiting for answers until the relay
// refuses one, and returns once that refusal is back. Each goes once the relay has taken the last
// into its queue to Cloudly (relay_upstream_pending_calls counts it) or refused it: no request
// reaches the relay behind the one it refuses. Sent ahead, what the node and its socket held when
// the first refusal came back was read and refused for nothing: with the node's whole queue
// (16 MiB) that was most of this test's time, with 256 KiB still megabytes and, at the smallest
// size, thousands of requests. 64 MiB sent without a refusal is a failure.
func floodUntilRefused(t *testing.T, e *env, n *sim.Node, method string, size int) {
	t.Helper()
	body := []byte(`{"session":{"nodeId":"` + n.ID + `"},"logs":"` + strings.Repeat("x", size-64) + `"}`)
	var refused atomic.Bool
	for sent := 0; !refused.Load(); sent++ {
		if sent*size > 64<<20 {
			t.Fatalf("%d requests of %d bytes sent and none refused", sent, size)
		}
		queued := e.Metric("relay_upstream_pending_calls")
		if _, err := n.Conn().CallAsync(method, body, func(r typedsocket.Reply) {
			if r.Err != nil && !errors.Is(r.Err, typedsocket.ErrClosed) {
				refused.Store(true)
			}
		}, typedsocket.Timeout(5*time.Minute)); err != nil {
			t.Fatal(err)
		}
		e.eventually("the request queued to Cloudly, or refused", func() bool {
			return refused.Load() || e.Metric("relay_upstream_pending_calls") > queued
		})
	}
}
