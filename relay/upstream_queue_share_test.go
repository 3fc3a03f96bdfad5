package relay_test

import (
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/sim"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
)

// One socket carries the whole cluster to Cloudly, and its send queue (65 536 frames, 256 MiB,
// decisions.md "Limits and timing") is shared first come, first served. When Cloudly's socket
// drains slower than nodes send — a WAN link, or Cloudly busy — one registered node sending
// max-size messages (each up to --max-message-bytes, 8 MiB; 256 in flight) fills all of it, and
// every other node is refused relay-upstream-busy. SPEC §5: "A slow node never delays another
// node or Cloudly's socket"; a flooding node must not either. Here Cloudly stops reading for a
// while; the flooder sends until the relay refuses it, with ever smaller messages; then an honest
// node's 1 MiB log batch must still be taken.
func TestOneNodeCannotTakeTheWholeUpstreamQueue(t *testing.T) {
	e := start(t, relay.Features{})
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
	if err := honest.Conn().CallAsync("stallCloudlyReadLoop", json.RawMessage(`{"session":{"nodeId":"node-honest"}}`), time.Minute, func(typedsocket.Reply) {}); err != nil {
		t.Fatal(err)
	}
	<-stalled

	const method = "reportRuntimeAssignmentLogs"
	for _, size := range []int{8<<20 - 1024, 64 << 10, 1 << 10} {
		floodUntilRefused(t, e, flooder, method, size)
	}

	outcome := make(chan error, 1)
	batch := []byte(`{"session":{"nodeId":"node-honest"},"logs":"` + strings.Repeat("y", 1<<20) + `"}`)
	if err := honest.Conn().CallAsync(method, batch, time.Minute, func(r typedsocket.Reply) { outcome <- r.Err }); err != nil {
		t.Fatal(err)
	}
	// The relay serves a connection's requests in order and answers this one itself: once its
	// answer is back, the batch has been queued upstream or refused, and a refusal read first.
	if _, err := honest.Call(ctx5(t), "openRuntimeAssignmentExec", json.RawMessage(`{}`)); !errors.Is(err, contracts.RelayMethodLocalOnly) {
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
}

// floodUntilRefused sends size-byte requests from n without waiting for answers until the relay
// refuses one, and returns once that refusal is back.
func floodUntilRefused(t *testing.T, e *env, n *sim.Node, method string, size int) {
	t.Helper()
	body := []byte(`{"session":{"nodeId":"` + n.ID + `"},"logs":"` + strings.Repeat("x", size-64) + `"}`)
	var refused atomic.Bool
	for sent := 0; !refused.Load(); {
		if sent > 1<<16 {
			t.Fatalf("%d requests of %d bytes sent and none refused", sent, size)
		}
		err := n.Conn().CallAsync(method, body, 5*time.Minute, func(r typedsocket.Reply) {
			if r.Err != nil && !errors.Is(r.Err, typedsocket.ErrClosed) {
				refused.Store(true)
			}
		})
		switch {
		case err == nil:
			sent++
		case errors.Is(err, typedsocket.ErrQueueFull):
			time.Sleep(time.Millisecond) // the flooder's own send queue: let it drain
		default:
			t.Fatal(err)
		}
	}
}
