package relay_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/relay"
)

// fakeComponent is a registry slot that only runs: it serves /v2/ with 404, says whether it is
// ready as told, and records what it saw of the relay when it was stopped.
type fakeComponent struct {
	fail error // Run returns it at once when set

	mu       sync.Mutex
	notReady error
	stopped  func() // runs when Run's ctx ends, before Run returns
}

func (c *fakeComponent) ServeHTTP(w http.ResponseWriter, _ *http.Request) { http.NotFound(w, nil) }

func (c *fakeComponent) Run(ctx context.Context) error {
	if c.fail != nil {
		return c.fail
	}
	<-ctx.Done()
	c.mu.Lock()
	stopped := c.stopped
	c.mu.Unlock()
	if stopped != nil {
		stopped()
	}
	return nil
}

func (c *fakeComponent) Ready() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.notReady
}

func (c *fakeComponent) set(notReady error, stopped func()) {
	c.mu.Lock()
	c.notReady, c.stopped = notReady, stopped
	c.mu.Unlock()
}

// TestComponents: the relay runs its components beside itself, asks each for /readyz, and stops
// them after its downstream connections and its Cloudly session are closed.
func TestComponents(t *testing.T) {
	t.Run("/readyz names a component that is not ready", func(t *testing.T) {
		c := &fakeComponent{}
		e := start(t, relay.Features{Registry: c})
		if code, _ := e.admin("/readyz"); code != 200 {
			t.Fatalf("/readyz = %d with every component ready", code)
		}
		c.set(errors.New("cache unusable"), nil)
		if code, body := e.admin("/readyz"); code != 503 || !strings.Contains(body, "registry: cache unusable") {
			t.Fatalf("/readyz = %d %q with the registry not ready", code, body)
		}
		c.set(nil, nil)
		if code, _ := e.admin("/readyz"); code != 200 {
			t.Fatalf("/readyz = %d once the registry is ready again", code)
		}
	})

	t.Run("components stop after the connections and the Cloudly session are closed", func(t *testing.T) {
		c := &fakeComponent{}
		e := start(t, relay.Features{Registry: c})
		e.node("node-a")
		var attached bool
		var connections float64
		c.set(nil, func() {
			attached, connections = e.relay.Upstream().Attached(), e.Metric("relay_downstream_connections")
		})
		e.shutdown()
		if attached || connections != 0 {
			t.Fatalf("a component was stopped with the relay attached (%v) or %v downstream connections open", attached, connections)
		}
	})

	t.Run("a component that fails stops the relay with its error", func(t *testing.T) {
		failed := errors.New("disk gone")
		token := filepath.Join(t.TempDir(), "cloudly.jwt")
		if err := os.WriteFile(token, []byte("jwt\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := relay.Config{ClusterID: "cluster-a", NodeID: "relay-node", CloudlyURL: "ws://127.0.0.1:1/", CloudlyTokenFile: token,
			Listen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: "127.0.0.1:0"}
		if err := cfg.Complete(); err != nil {
			t.Fatal(err)
		}
		r, err := relay.New(cfg, relay.Features{Registry: &fakeComponent{fail: failed}}, relay.Options{Logger: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		select {
		case err := <-done:
			if !errors.Is(err, failed) || !strings.Contains(err.Error(), "registry") {
				t.Fatalf("Serve returned %v, want the registry's error", err)
			}
		case <-time.After(relay.ShutdownTimeout + 5*time.Second):
			t.Fatal("the relay kept running after a component failed")
		}
	})
}
