package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/sim"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is one relay under test with its simulated Cloudly.
type env struct {
	t       *testing.T
	cloudly *sim.Cloudly
	relay   *relay.Relay
	cfg     relay.Config
	logs    *syncBuffer
	url     string // the relay's downstream ws:// URL

	stopOnce sync.Once
	stop     func()
}

// shutdown stops the relay (as SIGTERM would) and waits for Serve to return.
func (e *env) shutdown() { e.stopOnce.Do(e.stop) }

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs a relay against a fresh Cloudly stand-in and waits until it is attached. Logs are
// captured at debug level so tests can check nothing secret reaches them.
func start(t *testing.T, feats relay.Features) *env {
	t.Helper()
	e := &env{t: t, logs: &syncBuffer{}}
	log := zerolog.New(e.logs).Level(zerolog.DebugLevel)
	c, err := sim.NewCloudly(log)
	if err != nil {
		t.Fatal(err)
	}
	e.cloudly = c
	token := filepath.Join(t.TempDir(), "cloudly.jwt")
	if err := os.WriteFile(token, []byte("  "+c.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.cfg = relay.Config{
		ClusterID: c.ClusterID, NodeID: "relay-node", CloudlyURL: c.URL(), CloudlyTokenFile: token,
		Listen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: "127.0.0.1:0",
	}
	if err := e.cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(e.cfg, feats, log, relay.Options{PingInterval: 200 * time.Millisecond, DeadTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Listen(); err != nil {
		t.Fatal(err)
	}
	e.relay = r
	e.url = "ws://" + r.DownstreamAddr().String() + "/"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx) }()
	e.stop = func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(relay.ShutdownTimeout + 2*time.Second):
			t.Error("relay did not shut down within its timeout")
		}
	}
	t.Cleanup(func() {
		e.shutdown()
		c.Close()
	})
	e.waitAttached()
	return e
}

func (e *env) waitAttached() {
	e.t.Helper()
	e.eventually("relay attached", func() bool { return e.cloudly.Attached() && e.relay.Upstream().Attached() })
}

func (e *env) eventually(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// newNode connects a simulated node without registering it.
func newNode(t *testing.T, e *env, id string) *sim.Node {
	t.Helper()
	n := sim.NewNode(id, zerolog.Nop())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Connect(ctx, e.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

// node connects and registers a simulated node.
func (e *env) node(id string) *sim.Node {
	e.t.Helper()
	n := newNode(e.t, e, id)
	if _, err := n.Register(ctx5(e.t)); err != nil {
		e.t.Fatalf("register %s: %v", id, err)
	}
	return n
}

func (e *env) admin(path string) (int, string) {
	e.t.Helper()
	resp, err := http.Get("http://" + e.relay.AdminAddr().String() + path)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func ctx5(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// wantRefusal checks err is a remote error naming the refusal, with text "<name>: …".
func wantRefusal(t *testing.T, err error, name contracts.RefusalName) *typedsocket.Error {
	t.Helper()
	var e *typedsocket.Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v (%T), want the refusal %s", err, err, name)
	}
	if !errors.Is(err, name) || !strings.HasPrefix(e.Text, string(name)+": ") {
		t.Fatalf("err = %q (data %s), want the refusal %s", e.Text, e.Data, name)
	}
	return e
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprint(err))
	}
	return b
}
