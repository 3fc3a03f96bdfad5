package relay_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/ingress"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// TestUnregisteredConnections: what an anonymous peer may hold before it registers (docs/hostile.md).
func TestUnregisteredConnections(t *testing.T) {
	t.Run("bounded in all: beyond the limit an upgrade is answered 503, and an accepted registration frees a place", func(t *testing.T) {
		e := relaytest.Start(t, relaytest.Options{MaxUnregistered: 2})
		first := e.Dial("node-a")
		e.Dial("node-b")
		ctx := ctxHung(t)
		_, resp, err := websocket.Dial(ctx, e.URL, nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("a third unregistered connection: %v (response %v), want 503 with Retry-After", err, resp)
		}
		if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "limit"); got != 1 {
			t.Fatalf("unregistered_closed_total{limit} = %v, want 1", got)
		}
		if _, err := first.Register(ctx); err != nil {
			t.Fatal(err)
		}
		third := e.Dial("node-c") // node-a's place is free again
		if _, err := third.Register(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("each unregistered connection's own cost is charged to half the budget, beyond it 503", func(t *testing.T) {
		const budget = 16 << 20
		e := relaytest.Start(t, relaytest.Options{Configure: func(c *relay.Config) {
			c.PeerMemoryBytes = budget
			c.UpgradeBurstPerSource = 1 << 20 // under load every dial here comes from one address: the bucket out of the way
		}})
		// Some 300 dials one after another: on a loaded machine under -race they take longer than
		// five seconds together, and how long is not what this test is about; only a hang ends it.
		ctx := ctxHung(t)
		var held []*websocket.Conn
		defer func() {
			for _, ws := range held {
				ws.CloseNow()
			}
		}()
		for len(held) < budget/(8<<10) {
			ws, resp, err := websocket.Dial(ctx, e.URL, nil)
			if err == nil {
				held = append(held, ws)
				continue
			}
			if resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("after %d connections: %v (response %v), want 503 with Retry-After", len(held), err, resp)
			}
			break
		}
		if n := len(held); n < budget/2/(32<<10) || n > budget/2/(16<<10) {
			t.Fatalf("%d unregistered connections fit half a %d MiB budget; want each to cost 16 to 32 KiB", n, budget>>20)
		}
		if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "budget"); got != 1 {
			t.Fatalf("unregistered_closed_total{budget} = %v, want 1", got)
		}
		for _, ws := range held {
			ws.CloseNow()
		}
		held = nil
		e.Eventually("the connections' cost given back", func() bool { return e.Metric("relay_downstream_budget_used_bytes") == 0 })
		if _, err := e.Dial("node-a").Register(ctx); err != nil {
			t.Fatalf("a node once the attackers left: %v", err)
		}
	})

	t.Run("at most --max-unregistered-per-source from one address", func(t *testing.T) {
		e := relaytest.Start(t, relaytest.Options{Configure: func(c *relay.Config) { c.MaxUnregisteredPerSource = 2 }})
		first := e.Dial("node-a")
		e.Dial("node-b")
		ctx := ctxHung(t)
		_, resp, err := websocket.Dial(ctx, e.URL, nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("a third connection from 127.0.0.1: %v (response %v), want 503 with Retry-After", err, resp)
		}
		if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "source-limit"); got != 1 {
			t.Fatalf("unregistered_closed_total{source-limit} = %v, want 1", got)
		}
		if _, err := first.Register(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Dial("node-c").Register(ctx); err != nil {
			t.Fatalf("a registered connection does not count against its source: %v", err)
		}
	})

	t.Run("the registration deadline is absolute, a registration in flight does not extend it", func(t *testing.T) {
		const deadline = 300 * time.Millisecond
		e := relaytest.Start(t, relaytest.Options{RegisterDeadline: deadline})
		ctx := ctxHung(t)
		registered := e.Node("node-a")
		e.Cloudly.SetSlowness(3 * deadline) // node-b's registration is still with Cloudly at its deadline
		slow := e.Dial("node-b")
		_, err := slow.Register(ctx)
		if err == nil || !errors.Is(err, typedsocket.ErrClosed) {
			t.Fatalf("a registration still in flight at the deadline: %v, want the connection closed", err)
		}
		e.Cloudly.SetSlowness(0)
		var ce websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation {
			t.Fatalf("closed with %v, want 1008", err)
		}
		ws, _, err := websocket.Dial(ctx, e.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.CloseNow()
		if _, _, err = ws.Read(ctx); !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation {
			t.Fatalf("an idle unregistered connection ended with %v, want close 1008", err)
		}
		if got := e.Metric("relay_downstream_unregistered_closed_total", "reason", "overdue"); got != 2 {
			t.Fatalf("unregistered_closed_total{overdue} = %v, want 2", got)
		}
		if _, err := registered.Report(ctx, "reportRuntimeAssignmentObservation", map[string]any{}); err != nil {
			t.Fatalf("a registered node after the deadline: %v", err)
		}
	})

	t.Run("at most 8 registrations in an unregistered connection's lifetime", func(t *testing.T) {
		e := start(t, relay.Features{})
		anon := newNode(t, e, "node-guess")
		anon.Bearer = "bearer-guessed"
		for i := range relay.MaxRegistrationsPerConnection {
			if _, err := anon.Register(ctxHung(t)); err == nil || errors.Is(err, contracts.RelayNodeBusy) {
				t.Fatalf("guess %d: %v, want Cloudly's refusal", i, err)
			}
		}
		_, err := anon.Register(ctxHung(t))
		wantRefusal(t, err, contracts.RelayNodeBusy)
		if got := e.cloudly.Received(contracts.MethodRegisterPalletRuntimeSession); got != relay.MaxRegistrationsPerConnection {
			t.Fatalf("Cloudly judged %d bearer guesses from one connection, want %d", got, relay.MaxRegistrationsPerConnection)
		}
	})

	t.Run("anonymous registrations share one pool", func(t *testing.T) {
		// The pool is 1 MiB here, the default's sixteenth (RELAY_FAULTS=long: the default, 16 MiB):
		// the same rule, filled by 16 registrations of 60 KiB instead of 271.
		pool := int64(sized(1<<20, relay.AnonymousRegistrationBytes))
		// Every connection from 127.0.0.1, each with one registration at Cloudly (its most).
		x := relaytest.Start(t, relaytest.Options{AnonymousRegistrationBytes: pool,
			Configure: func(c *relay.Config) { c.MaxUnregisteredPerSource = 0 }})
		e := &env{Env: x, t: t, cloudly: x.Cloudly, relay: x.Relay, cfg: x.Config, logs: x.Logs, url: x.URL}
		release := make(chan struct{})
		var atCloudly atomic.Int64
		e.cloudly.HandleAsync(contracts.MethodRegisterPalletRuntimeSession, func(_ json.RawMessage, reply func(json.RawMessage, error)) {
			atCloudly.Add(1)
			go func() {
				<-release
				reply(nil, &typedsocket.Error{Text: "bearer-refused: the bearer is not the node's current credential", Data: json.RawMessage("null")})
			}()
		})
		t.Cleanup(func() { close(release) }) // runs before the relay's shutdown
		var reg map[string]any
		if err := json.Unmarshal(newNode(t, e, "node-pad").RegistrationBody(), &reg); err != nil {
			t.Fatal(err)
		}
		reg["pad"] = strings.Repeat("x", 60<<10) // under the 64 KiB limit of an unregistered connection
		body := mustJSON(reg)
		// More registrations than the pool holds: 16 more than fit (RELAY_FAULTS=long: twice as
		// many as fit). The pool lets one past its bytes at most, so at least 15 must be refused;
		// each registration is a connection and 60 KiB the race-detected relay reads, and twice
		// as many as fit the default pool took 12-29 s under load.
		fit := int(pool / int64(len(body)))
		conns := sized(fit+16, 2*fit)
		var busy atomic.Int64
		for i := range conns {
			anon := newNode(t, e, "node-anon")
			_, err := anon.Conn().CallAsync(contracts.MethodRegisterPalletRuntimeSession, body, func(r typedsocket.Reply) {
				if errors.Is(r.Err, contracts.RelayNodeBusy) {
					busy.Add(1)
				}
			}, typedsocket.Timeout(time.Minute))
			if err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
		}
		e.eventually("every registration at Cloudly or refused relay-node-busy", func() bool {
			return atCloudly.Load()+busy.Load() == int64(conns)
		})
		if busy.Load() == 0 {
			t.Fatalf("all %d registrations of %d KiB at Cloudly at once: no pool", conns, len(body)>>10)
		}
		if held := atCloudly.Load() * int64(len(body)); held > pool+int64(len(body)) {
			t.Fatalf("%d anonymous registrations (%d KiB) at Cloudly at once; the pool holds %d KiB",
				atCloudly.Load(), held>>10, pool>>10)
		}
		// A registered node's traffic is not charged to the pool: a log batch of 128 KiB, twice
		// what an unregistered connection may send and more than the full pool has left, is
		// carried (RELAY_FAULTS=long: 1 MiB).
		e.cloudly.HandleAsync(contracts.MethodRegisterPalletRuntimeSession, nil)
		n := e.node("node-honest")
		if _, err := n.Report(ctxHung(t), "reportRuntimeAssignmentLogs", map[string]any{"logs": strings.Repeat("y", sized(128<<10, 1<<20))}); err != nil {
			t.Fatalf("a registered node's log batch while the pool is full: %v", err)
		}
	})

	t.Run("a plain HTTP request is answered and its connection closed", func(t *testing.T) {
		e := start(t, relay.Features{})
		for _, path := range []string{"/", "/v2/"} {
			c, err := net.Dial("tcp", e.relay.DownstreamAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: relay\r\n\r\n")
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			if !resp.Close {
				t.Errorf("GET %s: %d without Connection: close", path, resp.StatusCode)
			}
			// The relay closes its end: the next read ends at once, not after a keep-alive timeout.
			start := time.Now()
			if _, err := c.Read(make([]byte, 1)); err == nil || time.Since(start) > 2*time.Second {
				t.Errorf("GET %s: the connection stayed open (%v after %s)", path, err, time.Since(start))
			}
		}
	})

	t.Run("a connection with both registrations in flight together ends up exactly one peer", func(t *testing.T) {
		node, ingressMethod := contracts.MethodRegisterPalletRuntimeSession, contracts.MethodRegisterClusterIngress
		for _, first := range []string{node, ingressMethod} {
			second := map[string]string{node: ingressMethod, ingressMethod: node}[first]
			t.Run(first+" first", func(t *testing.T) {
				var control *sim.IngressControl
				e := relaytest.Start(t, relaytest.Options{
					Cloudly: func(c *sim.Cloudly) { control = sim.ServeIngress(c) },
					Build: func(cfg relay.Config, o relay.Options) (*relay.Relay, error) {
						in, err := ingress.New(ingress.Options{Logger: o.Logger, Registerer: o.Registry})
						if err != nil {
							return nil, err
						}
						return relay.New(cfg, relay.Features{Parts: []relay.Part{{Name: "ingress", Impl: in}}}, o)
					},
				})
				control.Designate("node-a", "bearer-ingress-a")
				bodies := map[string]json.RawMessage{
					node:          sim.NewNode("node-a", zerolog.Nop()).RegistrationBody(),
					ingressMethod: sim.NewIngress("node-a", "bearer-ingress-a", zerolog.Nop()).RegistrationBody(),
				}
				// Cloudly is slow: the first registration is still at Cloudly when the second arrives.
				e.Cloudly.SetSlowness(300 * time.Millisecond)
				conn := e.Dial("node-a").Conn()
				replies := map[string]chan typedsocket.Reply{first: make(chan typedsocket.Reply, 1), second: make(chan typedsocket.Reply, 1)}
				for _, m := range []string{first, second} {
					if _, err := conn.CallAsync(m, bodies[m], func(r typedsocket.Reply) { replies[m] <- r }, typedsocket.Timeout(5*time.Second)); err != nil {
						t.Fatal(err)
					}
				}
				if r := <-replies[first]; r.Err != nil {
					t.Fatalf("%s, sent first: %v", first, r.Err)
				}
				wantRefusal(t, (<-replies[second]).Err, contracts.RelaySessionForeign)
				if got := e.Cloudly.Received(second); got != 0 {
					t.Fatalf("Cloudly received %d %s from a connection with %s in flight", got, second, first)
				}
				nodes, ingresses := e.Metric("relay_downstream_nodes"), e.Metric("relay_ingress_connections")
				if want := map[string][2]float64{node: {1, 0}, ingressMethod: {0, 1}}[first]; nodes != want[0] || ingresses != want[1] {
					t.Fatalf("the connection carries %v nodes and %v ingresses, want %v", nodes, ingresses, want)
				}
			})
		}
	})
}
