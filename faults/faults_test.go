// Package faults is the relay's fault suite: Cloudly flapping and slow, a node that never reads,
// a node that floods, the relay stopped with SIGTERM mid-traffic. Each fault states its figures —
// node sockets dropped, requests lost without an answer or a named refusal, goroutines leaked —
// and fails when a goal (zero) is missed.
//
//	go test ./faults                          # the short form CI runs
//	RELAY_FAULTS=long go test -timeout 30m ./faults   # the long form (README.md#measuring-it sizes)
//
// With RELAY_FAULTS_OUT=file each fault appends its figures to file as a Markdown table row.
// RELAY_FAULTS_RELAY_ENV adds to the environment of the faults that run the relay binary.
package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

func TestMain(m *testing.M) {
	if os.Getenv(flooderEnv) != "" {
		os.Exit(flooderMain()) // this binary re-run as TestFaultVPNHandshakeFlood's attacker
	}
	goleak.VerifyTestMain(m)
}

func long() bool { return os.Getenv("RELAY_FAULTS") == "long" }

// size picks the short or the long figure.
func size[T any](short, long_ T) T {
	if long() {
		return long_
	}
	return short
}

// figures are what every fault reports.
type figures struct {
	fault          string
	nodes          int
	answered       int64
	refusedByName  int64
	lost           int64 // sent, and neither answered nor refused by name
	socketsDropped int
	leaked         int // goroutines still running after everything was closed
	extra          string
}

func (f figures) check(t *testing.T) {
	t.Helper()
	row := fmt.Sprintf("| %s | %d | %d | %d | %d | %d | %d | %s |", f.fault, f.nodes, f.answered, f.refusedByName,
		f.lost, f.socketsDropped, f.leaked, f.extra)
	t.Log(row)
	if out := os.Getenv("RELAY_FAULTS_OUT"); out != "" {
		if file, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(file, row)
			file.Close()
		}
	}
	if f.lost != 0 {
		t.Errorf("%d requests lost without an answer or a named refusal", f.lost)
	}
	if f.socketsDropped != 0 {
		t.Errorf("%d node sockets dropped", f.socketsDropped)
	}
	if f.leaked != 0 {
		t.Errorf("%d goroutines leaked", f.leaked)
	}
}

// tally sorts request outcomes: an answer, a refusal by name, a request not sent because the
// node knew it could not be (its connection closed, or the relay said it is detaching), or lost.
type tally struct {
	answered, refused, lost atomic.Int64
	// Once cloudlyDropped is set (the test has Cloudly drop the relay's socket, as a crash would),
	// Cloudly's own calls that end with its socket are counted in cut, not lost.
	cloudlyDropped atomic.Bool
	cut            atomic.Int64
	mu             sync.Mutex
	why            map[string]int
}

func (ta *tally) add(err error) {
	var remote *typedsocket.Error
	switch {
	case err == nil:
		ta.answered.Add(1)
	case errors.As(err, &remote) && remote.Name() != "":
		ta.refused.Add(1)
	case err == typedsocket.ErrClosed || errors.Is(err, sim.ErrRelayDetaching) || errors.Is(err, sim.ErrNoRelaySocket):
	default:
		ta.lost.Add(1)
		ta.mu.Lock()
		if ta.why == nil {
			ta.why = map[string]int{}
		}
		ta.why[err.Error()]++
		ta.mu.Unlock()
	}
}

// register connects and registers n nodes, 32 at a time.
func register(t *testing.T, e *relaytest.Env, n int, prefix string) []*sim.Node {
	t.Helper()
	nodes := make([]*sim.Node, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			nodes[i] = e.Node(fmt.Sprintf("%s%04d", prefix, i))
		}()
	}
	wg.Wait()
	return nodes
}

// sendUntil has every node report to Cloudly back to back (pausing `pause` between requests)
// until stop is closed.
func sendUntil(nodes []*sim.Node, ta *tally, pause time.Duration, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var paced <-chan time.Time // each sender's rate, the load's shape: none, back to back
			if pause > 0 {
				tick := time.NewTicker(pause)
				defer tick.Stop()
				paced = tick.C
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				_, err := n.Report(ctx, "reportRuntimeAssignmentObservation", map[string]any{"i": i})
				cancel()
				ta.add(err)
				if err != nil { // a refused node backs off, as Pallet does, and stops on stop
					select {
					case <-time.After(50 * time.Millisecond):
					case <-stop:
						return
					}
				}
				if paced != nil {
					select {
					case <-paced:
					case <-stop:
						return
					}
				}
			}
		}()
	}
	return &wg
}

// dialFlooder connects and registers a node whose own send queue is large enough to flood.
func dialFlooder(t *testing.T, url, id string) *typedsocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := typedsocket.New(ws, typedsocket.Options{MaxQueue: 1 << 20, MaxQueueBytes: 1 << 30, ReadLimit: 1 << 20})
	go c.Run(context.Background())
	t.Cleanup(func() { c.CloseNow(); <-c.Done() })
	if _, err := c.Call(ctx, contracts.MethodRegisterPalletRuntimeSession, sim.NewNode(id, zerolog.Nop()).RegistrationBody()); err != nil {
		t.Fatal(err)
	}
	return c
}

func dropped(nodes []*sim.Node) int {
	n := 0
	for _, node := range nodes {
		select {
		case <-node.Conn().Done():
			n++
		default:
		}
	}
	return n
}

// leakedAfter counts goroutines above base once everything settled (up to 5 s), and logs their
// stacks when some remain.
func leakedAfter(t *testing.T, base int) int {
	// Closed connections' goroutines wind down on their own schedule (quic-go's, the HTTP
	// server's); the bound is for a leak, not for a busy machine.
	if await.Within(30*time.Second, func() bool { return runtime.NumGoroutine() <= base }) {
		return 0
	}
	buf := make([]byte, 1<<20)
	t.Logf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	return runtime.NumGoroutine() - base
}

// runFault starts a relay, lets body drive the fault and return the nodes whose sockets must
// survive, then closes everything and counts what outlived it.
func runFault(t *testing.T, f figures, body func(e *relaytest.Env, f *figures) []*sim.Node) {
	base := runtime.NumGoroutine()
	func() {
		e := relaytest.Start(t, relaytest.Options{})
		nodes := body(e, &f)
		f.socketsDropped = dropped(nodes)
		for _, n := range nodes {
			n.Close()
		}
		e.Close()
	}()
	f.leaked = leakedAfter(t, base)
	f.check(t)
}

// take records a tally's outcomes.
func (f *figures) take(ta *tally, t *testing.T) {
	f.answered, f.refusedByName, f.lost = ta.answered.Load(), ta.refused.Load(), f.lost+ta.lost.Load()
	if ta.lost.Load() > 0 {
		t.Logf("lost: %v", ta.why)
	}
}

// TestFaultCloudlyFlapping: Cloudly drops the relay's socket every 2 s for 60 s under 1 000 nodes
// (short: every 500 ms for 5 s under 200).
func TestFaultCloudlyFlapping(t *testing.T) {
	nodeCount, every, total := size(200, 1000), size(500*time.Millisecond, 2*time.Second), size(5*time.Second, 60*time.Second)
	runFault(t, figures{fault: fmt.Sprintf("Cloudly flapping every %s for %s", every, total), nodes: nodeCount},
		func(e *relaytest.Env, f *figures) []*sim.Node {
			nodes := register(t, e, nodeCount, "node-")
			var ta tally
			stop := make(chan struct{})
			senders := sendUntil(nodes, &ta, 20*time.Millisecond, stop)
			drops := 0
			for end := time.Now().Add(total); time.Now().Before(end); drops++ {
				phase(every)
				e.Cloudly.Drop()
			}
			e.Eventually("re-attached after the last drop", func() bool { return e.Relay.Upstream().Attached() })
			close(stop)
			senders.Wait()
			f.take(&ta, t)
			f.extra = fmt.Sprintf("%d drops, %d registrations", drops, e.Cloudly.Registrations())
			return nodes
		})
}

// TestFaultCloudlySlow: Cloudly answers every request 2 s late (short: 300 ms); every request is
// still answered and none is refused.
func TestFaultCloudlySlow(t *testing.T) {
	nodeCount, delay, total := size(50, 500), size(300*time.Millisecond, 2*time.Second), size(3*time.Second, 20*time.Second)
	runFault(t, figures{fault: fmt.Sprintf("Cloudly answering %s late", delay), nodes: nodeCount},
		func(e *relaytest.Env, f *figures) []*sim.Node {
			nodes := register(t, e, nodeCount, "node-")
			e.Cloudly.SetSlowness(delay)
			var ta tally
			stop := make(chan struct{})
			senders := sendUntil(nodes, &ta, 0, stop)
			phase(total)
			close(stop)
			senders.Wait()
			f.take(&ta, t)
			if f.refusedByName != 0 {
				t.Errorf("%d requests refused although Cloudly answers them all", f.refusedByName)
			}
			return nodes
		})
}

// TestFaultNodeNeverReads: one node registers and never reads again while Cloudly keeps sending
// to it; the other nodes' traffic is untouched and the stalled node's requests are refused
// relay-node-busy.
func TestFaultNodeNeverReads(t *testing.T) {
	nodeCount := size(50, 500)
	runFault(t, figures{fault: "a node that never reads", nodes: nodeCount}, func(e *relaytest.Env, f *figures) []*sim.Node {
		stalled, err := sim.DialStalled(context.Background(), e.URL, "node-stalled")
		if err != nil {
			t.Fatal(err)
		}
		defer stalled.Close()
		nodes := register(t, e, nodeCount, "node-")
		var busy atomic.Int64
		filled := make(chan struct{})
		fill := sync.OnceFunc(func() { close(filled) })
		stop := make(chan struct{})
		var flood sync.WaitGroup
		flood.Add(1)
		go func() {
			defer flood.Done()
			body := []byte(`{"session":{"nodeId":"node-stalled"},"pad":"` + strings.Repeat("x", 32<<10) + `"}`)
			tick := time.NewTicker(time.Millisecond) // the flood's rate: a thousand calls a second
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				e.Cloudly.CallAsync("applyRuntimeAssignment", body, func(r typedsocket.Reply) {
					if errors.Is(r.Err, contracts.RelayNodeBusy) {
						busy.Add(1)
						fill()
					}
				})
			}
		}()
		var ta tally
		senders := sendUntil(nodes, &ta, 5*time.Millisecond, stop)
		phase(size(3*time.Second, 20*time.Second))
		// The fault lasts its length and on until the stalled node's queue has filled once: a
		// starved machine may take longer to send the calls that fill it. The bound is for a hang.
		select {
		case <-filled:
		case <-time.After(floodHang):
		}
		close(stop)
		senders.Wait()
		flood.Wait()
		f.take(&ta, t)
		f.extra = fmt.Sprintf("stalled node answered relay-node-busy %d times", busy.Load())
		if busy.Load() == 0 {
			t.Error("the stalled node's queue never filled: the fault was not exercised")
		}
		if f.refusedByName != 0 {
			t.Errorf("the other nodes got %d refusals", f.refusedByName)
		}
		return nodes
	})
}

// TestFaultNodeFloods: one node sends requests as fast as it can without waiting for answers;
// beyond its in-flight limit the relay answers relay-node-busy, and the other nodes' traffic is
// untouched.
func TestFaultNodeFloods(t *testing.T) {
	nodeCount := size(50, 500)
	runFault(t, figures{fault: "a node that floods", nodes: nodeCount}, func(e *relaytest.Env, f *figures) []*sim.Node {
		flooder := dialFlooder(t, e.URL, "node-flooder")
		nodes := register(t, e, nodeCount, "node-")
		e.Cloudly.SetSlowness(50 * time.Millisecond) // answers take a while, so the flood piles up
		var flooderTally tally
		var pending sync.WaitGroup
		body := []byte(`{"session":{"nodeId":"node-flooder"}}`)
		for range size(5000, 50000) {
			pending.Add(1)
			_, err := flooder.CallAsync("reportRuntimeAssignmentLogs", body, func(r typedsocket.Reply) {
				flooderTally.add(r.Err)
				pending.Done()
			}, typedsocket.Timeout(time.Minute))
			if err != nil {
				t.Fatalf("the flooder could not send: %v", err)
			}
		}
		var ta tally
		stop := make(chan struct{})
		senders := sendUntil(nodes, &ta, 5*time.Millisecond, stop)
		pending.Wait()
		phase(500 * time.Millisecond) // the honest nodes go on sending with the flood pending
		close(stop)
		senders.Wait()
		f.lost = flooderTally.lost.Load()
		f.take(&ta, t)
		f.extra = fmt.Sprintf("flooder: %d answered, %d refused by name", flooderTally.answered.Load(), flooderTally.refused.Load())
		if flooderTally.refused.Load() == 0 {
			t.Error("the flood was never refused: the fault was not exercised")
		}
		if f.refusedByName != 0 {
			t.Errorf("the other nodes got %d refusals", f.refusedByName)
		}
		return nodes
	})
}
