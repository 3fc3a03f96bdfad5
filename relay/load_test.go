package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sync/errgroup"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// TestStalledNodeDoesNotSlowOthers: one node stops reading while Cloudly keeps sending to it; the
// other 10 nodes' traffic in both directions, 10 round trips each way apiece, completes
// (RELAY_FAULTS=long: 50 nodes, 20 round trips), and the stalled node's requests are refused
// relay-node-busy instead of piling up. Every round trip crosses the relay while the stalled
// node's queue is full and the flood goes on: one that waited behind it would hang the test,
// whatever the number of nodes.
func TestStalledNodeDoesNotSlowOthers(t *testing.T) {
	count, rounds := sized(10, 50), sized(10, 20)
	e := start(t, relay.Features{})
	stalled, err := sim.DialStalled(ctxHung(t), e.url, "node-stalled")
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	nodes := make([]*sim.Node, count)
	for i := range nodes {
		nodes[i] = e.node(fmt.Sprintf("node-%02d", i))
	}

	// Send to the stalled node until the relay refuses, and keep on during the test, but never
	// more than 4 frames ahead of what Cloudly's socket has written (RELAY_FAULTS=long: 16).
	// (Paced by time instead, at 1 000 a second, the race-detected relay read the flood slower
	// than Cloudly sent it on a loaded machine: Cloudly's socket came to carry mostly the flood and
	// every other answer on it waited behind, head-of-line blocking Cloudly causes, not the relay.
	// Sixteen ahead, ten rounds took six to nine times as long as with four, all of it waiting in
	// Cloudly's queue; with four the relay still refuses some five hundred of the flood's frames a
	// second while the round trips cross it.)
	ahead := sized(4, 16)
	// The stalled node's queue is bounded by count (256 frames) long before its share's bytes:
	// frames of 4 KiB fill it, and the socket before it, as those of 32 KiB (RELAY_FAULTS=long)
	// do, with a fraction of the bytes, which are what a race-detected relay spends its time on.
	big := json.RawMessage(`{"session":{"nodeId":"node-stalled"},"pad":"` + strings.Repeat("x", sized(4<<10, 32<<10)) + `"}`)
	var busy atomic.Int64
	var flood sync.WaitGroup
	stopFlood := make(chan struct{})
	flood.Add(1)
	go func() {
		defer flood.Done()
		for {
			select {
			case <-stopFlood:
				return
			default:
			}
			// Cloudly's own send queue announces no room: the flood polls it (and its stop).
			stopped := func() bool {
				select {
				case <-stopFlood:
					return true
				default:
					return false
				}
			}
			if !await.Within(time.Minute, func() bool { return stopped() || e.cloudly.QueueLen() < ahead }) || stopped() {
				continue
			}
			e.cloudly.CallAsync("applyRuntimeAssignment", big, func(r typedsocket.Reply) {
				if errors.Is(r.Err, contracts.RelayNodeBusy) {
					busy.Add(1)
				}
			})
		}
	}()
	e.eventually("the stalled node's queue full", func() bool { return busy.Load() > 0 })

	// A bound on liveness, not a speed figure: the full race-detected suite on two shared cores
	// took longer than 30 s for 2 000 round trips (the long form's) beside the flood.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var g errgroup.Group
	for _, n := range nodes {
		g.Go(func() error {
			for i := range rounds {
				if _, err := n.Report(ctx, "reportRuntimeAssignmentObservation", map[string]any{"i": i}); err != nil {
					return fmt.Errorf("%s → Cloudly: %w", n.ID, err)
				}
				body := json.RawMessage(fmt.Sprintf(`{"session":{"nodeId":%q},"i":%d}`, n.ID, i))
				if _, err := e.cloudly.Call(ctx, "readRuntimeAssignmentStats", body); err != nil {
					return fmt.Errorf("Cloudly → %s: %w", n.ID, err)
				}
			}
			return nil
		})
	}
	err = g.Wait()
	close(stopFlood)
	flood.Wait()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if got := n.Received("readRuntimeAssignmentStats"); got != rounds {
			t.Fatalf("%s received %d of %d requests", n.ID, got, rounds)
		}
	}
}

// TestFlappingCloudly: Cloudly drops the socket 6 times while 40 nodes send (RELAY_FAULTS=long:
// 20 times, 200 nodes). No node socket is dropped, and every request is answered or refused by
// name. What can go wrong happens at each drop, to the requests in flight then (one a node) and to
// those sent while detached: each drop with forty nodes sending puts forty requests at stake, and
// the full size adds drops and nodes, not kinds of moment. (Goroutine leaks are checked by
// TestMain once every test has ended.)
func TestFlappingCloudly(t *testing.T) {
	drops, count := sized(6, 20), sized(40, 200)
	if testing.Short() {
		t.Skipf("%d nodes and %d reconnects", count, drops)
	}
	e := start(t, relay.Features{})
	nodes := make([]*sim.Node, count)
	var g errgroup.Group
	g.SetLimit(32)
	for i := range nodes {
		g.Go(func() error {
			n := newNode(t, e, fmt.Sprintf("node-%03d", i))
			nodes[i] = n
			_, err := n.Register(context.Background())
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}

	var answered, refused atomic.Int64
	var mu sync.Mutex
	unnamed := map[string]int{}
	stop := make(chan struct{})
	var senders sync.WaitGroup
	for _, n := range nodes {
		senders.Add(1)
		go func() {
			defer senders.Done()
			paced := time.NewTicker(5 * time.Millisecond)
			defer paced.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := n.Report(ctx, "reportRuntimeAssignmentObservation", map[string]any{"i": i})
				cancel()
				var remote *typedsocket.Error
				switch {
				case err == nil:
					answered.Add(1)
				case errors.As(err, &remote) && (errors.Is(err, contracts.RelayUpstreamDetached) || errors.Is(err, contracts.RelayUpstreamBusy)):
					refused.Add(1)
				default:
					mu.Lock()
					unnamed[err.Error()]++
					mu.Unlock()
				}
				select { // the load's shape: each node reports 200 times a second at most
				case <-paced.C:
				case <-stop:
					return
				}
			}
		}()
	}
	// Each session carries traffic before Cloudly drops it, and the last one after.
	flowing := func(what string) {
		before := answered.Load()
		e.eventually(what, func() bool { return answered.Load() >= before+20 })
	}
	for i := range drops {
		flowing(fmt.Sprintf("answers on session %d", i+1))
		e.cloudly.Drop()
		e.eventually(fmt.Sprintf("re-attach %d", i+1), func() bool { return e.cloudly.Registrations() == int64(i+2) })
	}
	flowing("answers after the last re-attach")
	close(stop)
	senders.Wait()

	if len(unnamed) > 0 {
		t.Fatalf("requests lost without an answer or a named refusal: %v", unnamed)
	}
	for _, n := range nodes {
		select {
		case <-n.Conn().Done():
			t.Fatalf("node socket %s was dropped: %v", n.ID, context.Cause(n.Conn().Context()))
		default:
		}
	}
	if answered.Load() == 0 || refused.Load() == 0 {
		t.Fatalf("answered %d, refused %d: the test did not exercise both", answered.Load(), refused.Load())
	}
	t.Logf("answered %d, refused by name %d, node sockets dropped 0", answered.Load(), refused.Load())
}

func TestShutdownClosesDownstreamWithGoingAway(t *testing.T) {
	e := start(t, relay.Features{})
	n := e.node("node-a")
	start := time.Now()
	e.shutdown()
	if d := time.Since(start); d > relay.ShutdownTimeout {
		t.Fatalf("shutdown took %s", d)
	}
	select {
	case <-n.Conn().Done():
	case <-time.After(relay.ShutdownTimeout + time.Second):
		t.Fatal("the node's connection outlived the relay")
	}
	if code := websocket.CloseStatus(context.Cause(n.Conn().Context())); code != websocket.StatusGoingAway {
		t.Fatalf("close status %d, want 1001", code)
	}
}

// TestShutdownMidTrafficLosesNothing: with nodes sending and Cloudly answering slowly, a shutdown
// answers every request already sent — Cloudly's answer, or a refusal by name — before it closes.
func TestShutdownMidTrafficLosesNothing(t *testing.T) {
	e := start(t, relay.Features{})
	e.cloudly.SetSlowness(50 * time.Millisecond)
	nodes := make([]*sim.Node, 20)
	for i := range nodes {
		nodes[i] = e.node(fmt.Sprintf("node-%02d", i))
	}
	var answered, refused, lost atomic.Int64
	var lostMu sync.Mutex
	lostErrs := map[string]int{}
	var wg sync.WaitGroup
	for _, n := range nodes {
		for range 4 { // several requests in flight per node
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-n.Conn().Done():
						return // closed: nothing more is sent
					default:
					}
					_, err := n.Report(context.Background(), "reportRuntimeAssignmentObservation", map[string]any{"i": i})
					var remote *typedsocket.Error
					switch {
					case err == nil:
						answered.Add(1)
					case errors.As(err, &remote) && remote.Name() != "":
						refused.Add(1)
					case err == typedsocket.ErrClosed || errors.Is(err, sim.ErrRelayDetaching):
						return // not sent: the relay said it is detaching, or the connection had closed
					default:
						lost.Add(1) // sent, and the connection closed before any answer
						lostMu.Lock()
						lostErrs[err.Error()]++
						lostMu.Unlock()
					}
				}
			}()
		}
	}
	e.eventually("requests answered and more in flight", func() bool { return answered.Load() >= 40 })
	e.shutdown()
	wg.Wait()
	t.Logf("answered %d, refused by name %d, lost %d", answered.Load(), refused.Load(), lost.Load())
	if lost.Load() != 0 {
		t.Fatalf("%d requests lost without an answer or a named refusal: %v", lost.Load(), lostErrs)
	}
	if answered.Load() == 0 {
		t.Fatal("no request was answered: the test exercised nothing")
	}
}
