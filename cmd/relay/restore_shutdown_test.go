package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/testenv/relaytest"
	"code.foss.global/serve.zone/relay/internal/testenv/sim"
)

// TestShutdownAbandonsCorestoreCallsInFlight: restore.Restore.Close "abandons the calls in flight
// (each is answered restore-node-unreachable), refuses new ones, and waits until every call has
// been answered". A relay built by build() must run it when it shuts down, so that no Corestore
// call outlives the relay: once Serve has returned, the Corestore must have seen its request
// cancelled, not kept it open until the client's 30 s timeout.
func TestShutdownAbandonsCorestoreCallsInFlight(t *testing.T) {
	entered := make(chan struct{}, 1)
	cancelled := make(chan struct{})
	release := make(chan struct{})
	cs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // read to its end, so the server notices the client leaving
		entered <- struct{}{}
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-release:
		}
	}))
	t.Cleanup(cs.Close)
	t.Cleanup(func() { close(release) })

	e := relaytest.Start(t, relaytest.Options{Build: build, Quiet: true,
		Cloudly: func(c *sim.Cloudly) {
			c.SetCorestores([]contracts.CorestoreOrigin{{NodeID: "node-7", Origin: cs.URL}})
		},
	})
	body := []byte(`{"nodeId":"node-7","control":{"grant":"g","expectedRevision":0}}`)
	go func() {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			_, err := e.Cloudly.Call(ctx, contracts.MethodPrepareIsolatedRestoreOnNode, body)
			cancel()
			if err == nil || !strings.Contains(err.Error(), "restore-node-not-carried") {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the Corestore call never arrived")
	}
	e.Shutdown() // Serve has returned: the relay is down
	select {
	case <-cancelled:
	case <-time.After(2 * time.Second):
		t.Fatal("the relay shut down but its Corestore call is still in flight: restore.Close was never run")
	}
}
