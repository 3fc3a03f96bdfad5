package relay_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// termElector leads at once, within a tenure the test ends (held), for one term that the test
// ends (end): then Run returns, as an Elector's does once the relay has fenced.
type termElector struct {
	held atomic.Bool
	end  chan struct{}
}

func (e *termElector) Run(ctx context.Context, lead func(context.Context)) error {
	leadCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-e.end:
		case <-ctx.Done():
		}
		cancel()
	}()
	lead(leadCtx)
	return nil
}

func (e *termElector) Ready() error { return nil }
func (e *termElector) Status() any  { return map[string]string{"holder": "pod-a"} }
func (e *termElector) Held() bool   { return e.held.Load() }

// TestTenureEndedForwardsNothing: the instant the tenure ends, before anything fenced the relay,
// a node's request is refused relay-upstream-detached and nothing more reaches Cloudly; once the
// term ends the relay ends, Serve returning ErrTermEnded, so that its process exits and comes back
// a standby.
func TestTenureEndedForwardsNothing(t *testing.T) {
	cloudly, err := sim.NewCloudly(zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer cloudly.Close()
	token := filepath.Join(t.TempDir(), "jwt")
	if err := os.WriteFile(token, []byte(cloudly.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := relay.Config{ClusterID: cloudly.ClusterID, NodeID: "relay-node", CloudlyURL: cloudly.URL(), CloudlyTokenFile: token,
		Listen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: "127.0.0.1:0"}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	el := &termElector{end: make(chan struct{})}
	el.held.Store(true)
	r, err := relay.New(cfg, relay.Features{}, relay.Options{Elector: el})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- r.Serve(ctx) }()
	await.Until(t, "attached", 15*time.Second, func() bool { return cloudly.Attached() && r.Upstream().Attached() })

	n := sim.NewNode("node-a", zerolog.Nop())
	defer n.Close()
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	if err := n.Connect(cctx, "ws://"+r.DownstreamAddr().String()+"/"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Register(cctx); err != nil {
		t.Fatal(err)
	}
	const method = "reportRuntimeAssignmentObservation"
	if _, err := n.Report(cctx, method, map[string]any{"i": 1}); err != nil {
		t.Fatal(err)
	}
	before := cloudly.Received(method)

	el.held.Store(false)
	_, err = n.Report(cctx, method, map[string]any{"i": 2})
	if err == nil || !strings.Contains(err.Error(), "relay-upstream-detached") {
		t.Fatalf("a request after the tenure ended: %v; want relay-upstream-detached", err)
	}
	if got := cloudly.Received(method); got != before {
		t.Fatalf("Cloudly received %d requests after the tenure ended", got-before)
	}

	close(el.end)
	select {
	case err := <-served:
		if !errors.Is(err, relay.ErrTermEnded) {
			t.Fatalf("Serve returned %v at the end of the term, want ErrTermEnded", err)
		}
	case <-time.After(relay.ShutdownTimeout + 5*time.Second):
		t.Fatal("the relay did not end with its term")
	}
	if got := cloudly.Received(method); got != before {
		t.Fatalf("Cloudly received %d requests after the tenure ended", got-before)
	}
}
