package relay

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/internal/budget"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/testenv/memnet"
)

// TestEvictionSparesASlowReader: with the peer memory budget spent, the relay evicts a connection
// whose peer reads nothing, never one whose peer reads slowly. The slow peer takes one frame every
// two seconds — twenty times the 100 ms after which a write that had not moved once counted as
// reading nothing, and longer than its queue ever stays empty — for thirty seconds; the other
// takes nothing. Under the bubble's clock a pause is exactly as long as the test says, as a
// descheduled peer's would be on a starved machine.
func TestEvictionSparesASlowReader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow, grantSlow := throttledPeer(t)
		dead, _ := throttledPeer(t)
		frame := json.RawMessage(`{"pad":"` + strings.Repeat("a", 64<<10) + `"}`)
		send := func(c *typedsocket.Conn) {
			t.Helper()
			if _, err := c.CallAsync("applyRuntimeAssignment", frame, func(typedsocket.Reply) {}, typedsocket.Timeout(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
		send(slow)
		send(dead)
		synctest.Wait() // both send loops inside a write their peer does not take
		for range 4 {   // and more queued behind it
			send(slow)
			send(dead)
		}
		for i := range 15 {
			time.Sleep(2 * time.Second)
			if _, stalled := waiting(slow); stalled {
				t.Fatalf("after %d s, the peer that reads a frame every two seconds counts as reading nothing", 2*(i+1))
			}
			grantSlow(len(frame) + 64) // it reads a frame
			send(slow)                 // and another is queued: its queue never empties
			synctest.Wait()
		}
		if _, stalled := waiting(dead); !stalled {
			t.Fatal("the peer that has read nothing for 30 s does not count as reading nothing")
		}

		// The budget spent, a charge that does not fit evicts the non-reader, not the slow reader.
		b := budget.New(64 << 20)
		var evicted []string
		for name, c := range map[string]*typedsocket.Conn{"slow": slow, "dead": dead} {
			b.NewShare(1<<30, func() (int64, bool) { return waiting(c) }, func() { evicted = append(evicted, name) })
		}
		b.NewShare(1<<30, nil, nil).Charge(int(b.Limit()) + 1)
		if len(evicted) != 1 || evicted[0] != "dead" {
			t.Fatalf("evicted %v: want the peer that reads nothing alone", evicted)
		}
	})
}

// throttledPeer is the relay's end of a connection, in a synctest bubble, to a peer that takes only
// the bytes it is granted — a socket whose buffers are full takes no more than its reader reads.
// grant(n) lets n more bytes leave.
func throttledPeer(t *testing.T) (c *typedsocket.Conn, grant func(n int)) {
	t.Helper()
	client, server := memnet.Pipe()
	th := &throttled{Conn: server, grants: make(chan int, 1<<10), closed: make(chan struct{})}
	th.grants <- 4 << 10 // the upgrade's answer
	accepted := make(chan *typedsocket.Conn, 1)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c := typedsocket.New(ws, typedsocket.Options{Logger: zerolog.Nop(), PingInterval: time.Hour, DeadTimeout: time.Hour,
			MaxQueue: 1 << 10, MaxQueueBytes: 1 << 30})
		accepted <- c
		c.Run(context.Background())
	})}
	served := make(chan struct{})
	go func() { hs.Serve(memnet.Once(th)); close(served) }()
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return client, nil }}
	ws, _, err := websocket.Dial(context.Background(), "ws://pipe/", &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	c = <-accepted
	t.Cleanup(func() {
		ws.CloseNow()
		c.CloseNow()
		<-c.Done()
		hs.Close()
		<-served
		tr.CloseIdleConnections()
	})
	return c, func(n int) { th.grants <- n }
}

// throttled is a connection whose writes wait for grants of bytes.
type throttled struct {
	net.Conn
	grants chan int
	closed chan struct{}
	once   sync.Once
	left   int // used by the writer alone: the WebSocket library writes one frame at a time
}

func (c *throttled) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if c.left == 0 {
			select {
			case g := <-c.grants:
				c.left = g
			case <-c.closed:
				return n, net.ErrClosed
			}
		}
		k := min(c.left, len(p)-n)
		if _, err := c.Conn.Write(p[n : n+k]); err != nil {
			return n, err
		}
		n, c.left = n+k, c.left-k
	}
	return n, nil
}

func (c *throttled) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}
