package relay_test

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/escrow"
	"code.foss.global/serve.zone/relay/internal/relaytest"
	"code.foss.global/serve.zone/relay/internal/sim"
	"code.foss.global/serve.zone/relay/relay"
)

// pausingWriter holds the relay's "node registered" log line — written by the relay between
// binding a node and telling its observers — until pause has run, once armed.
type pausingWriter struct {
	armed atomic.Bool
	pause func()
	once  sync.Once
}

func (w *pausingWriter) Write(p []byte) (int, error) {
	if w.armed.Load() && bytes.Contains(p, []byte(`"message":"node registered"`)) {
		w.once.Do(w.pause)
	}
	return len(p), nil
}

// A node connection that ends while Cloudly's acceptance of its registration is being bound must
// leave no binding in escrow: escrow-node-not-carried means "no current session of that node on
// this relay" (SPEC §6), and a feature must keep nothing for a connection that is gone. The
// relay once told escrow NodeBound after NodeGone when the connection ended between the two, so
// the escrow held runs for, and released them to, a dead connection until the node came back;
// escrow now follows the connection's end through its context.
func TestNodeConnectionEndingWhileItIsBoundLeavesNoEscrowCarrier(t *testing.T) {
	esc, err := escrow.New(escrow.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := &pausingWriter{}
	e := relaytest.Start(t, relaytest.Options{
		Build: func(cfg relay.Config, opts relay.Options) (*relay.Relay, error) {
			opts.Logger = zerolog.New(w)
			return relay.New(cfg, relay.Features{Escrow: esc}, opts)
		},
	})

	// A first connection of node-a gives the session scope a run is built for; it ends cleanly.
	first := e.Node("node-a")
	session := first.Session()
	first.Close()
	e.Eventually("the first connection is carried by no one", func() bool { return e.Metric("relay_downstream_connections") == 0 })

	second := e.Dial("node-a")
	w.pause = func() {
		// The relay has bound the second connection and not yet told escrow: the connection ends
		// now, and the relay unbinds it (the nodes gauge drops).
		second.Close()
		for e.Metric("relay_downstream_nodes") != 0 {
			time.Sleep(time.Millisecond)
		}
	}
	w.armed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	second.Register(ctx) // the connection closes before the answer
	e.Eventually("the second connection is carried by no one", func() bool {
		return e.Metric("relay_downstream_nodes") == 0 && e.Metric("relay_downstream_connections") == 0
	})

	run := sim.EscrowRun{Session: session, Start: time.Now(), Count: 4, Step: time.Minute, Window: 2 * time.Minute}
	body, err := run.Request()
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Cloudly.Call(ctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, body)
	if err == nil {
		t.Fatal("escrow held a run for node-a, whose only connection has ended: it still counts the dead connection as the node's carrier")
	}
	wantRefusal(t, err, contracts.EscrowNodeNotCarried)
}
