package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// long is whether the load tests run at full size, as the fault suite's long form does:
//
//	RELAY_FAULTS=long go test -race -timeout 30m ./relay
//
// By default each is sized to its subject: more peers, messages or reconnects than any bound it
// judges lets through, so that the bound is what holds them back, and no more; the full sizes
// (hundreds of nodes, tens of reconnects, floods of many times the budget) stay for this form.
func long() bool { return os.Getenv("RELAY_FAULTS") == "long" }

// sized is short by default and full under RELAY_FAULTS=long.
func sized(short, full int) int {
	if long() {
		return full
	}
	return short
}

// env is one relay under test with its simulated Cloudly (testenv/relaytest), with the short
// names these tests use.
type env struct {
	*relaytest.Env
	t       *testing.T
	cloudly *sim.Cloudly
	relay   *relay.Relay
	cfg     relay.Config
	logs    *relaytest.Buffer
	url     string
}

// start runs a relay against a fresh Cloudly stand-in and waits until it is attached. Logs are
// captured at debug level so tests can check nothing secret reaches them.
func start(t *testing.T, feats relay.Features) *env {
	t.Helper()
	x := relaytest.Start(t, relaytest.Options{Features: feats})
	return &env{Env: x, t: t, cloudly: x.Cloudly, relay: x.Relay, cfg: x.Config, logs: x.Logs, url: x.URL}
}

func (e *env) shutdown()                             { e.Shutdown() }
func (e *env) waitAttached()                         { e.t.Helper(); e.WaitAttached() }
func (e *env) eventually(what string, c func() bool) { e.t.Helper(); e.Eventually(what, c) }
func (e *env) node(id string) *sim.Node              { e.t.Helper(); return e.Node(id) }

// newNode connects a simulated node without registering it.
func newNode(t *testing.T, e *env, id string) *sim.Node { t.Helper(); return e.Dial(id) }

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

// ctxHung bounds a wait that ends when the relay or a simulated peer signals something: past it,
// something hung. It is no claim about speed; a busy machine may take many seconds for what a
// quiet one does at once, and must not fail the test for it.
func ctxHung(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hungAfter)
	t.Cleanup(cancel)
	return ctx
}

// hungAfter is how long ctxHung waits.
const hungAfter = 2 * time.Minute

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
