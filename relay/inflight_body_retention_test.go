package relay_test

import (
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
)

// A node's request stays in flight until Cloudly answers (up to the 60 s call timeout), and the
// node may have 256 of them, each up to --max-message-bytes (8 MiB). Once a request's frame has
// been written upstream the relay needs nothing of its body; keeping it would let one registered
// node make the relay hold 256 × 8 MiB = 2 GiB for a minute (and every node as much), outside
// every queue bound (decisions.md "Limits and timing" bounds queued frames and answers only).
func TestForwardedRequestBodiesAreNotHeldWhileCloudlyThinks(t *testing.T) {
	e := start(t, relay.Features{})
	const method = "reportRuntimeAssignmentLogs"
	release := make(chan struct{})
	var atCloudly atomic.Int64
	e.cloudly.HandleAsync(method, func(_ json.RawMessage, reply func(json.RawMessage, error)) {
		atCloudly.Add(1)
		go func() { <-release; reply(json.RawMessage(`{}`), nil) }()
	})
	t.Cleanup(func() { close(release) })
	n := e.node("node-a")

	const count, size = 24, 1 << 20
	body := []byte(`{"session":{"nodeId":"node-a"},"logs":"` + strings.Repeat("x", size) + `"}`)
	before := heapInUse()
	for range count {
		for {
			err := n.Conn().CallAsync(method, body, time.Minute, func(typedsocket.Reply) {})
			if err == nil {
				break
			}
			if !errors.Is(err, typedsocket.ErrQueueFull) {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond) // the node's own send queue: let it drain
		}
	}
	e.eventually("every request is at Cloudly", func() bool { return atCloudly.Load() == count })
	held := int64(heapInUse()) - int64(before)
	if held > count*size/3 {
		t.Errorf("with %d requests of 1 MiB in flight at Cloudly the heap grew by %d MiB: the relay holds their bodies", count, held>>20)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
