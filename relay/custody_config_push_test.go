package relay_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/sim"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
)

// disablingCloudly accepts the relay's registration and pushes pushClusterRelayConfig with
// relay: null right after it, on the same socket — Cloudly pushes the configuration "after each
// accepted registration" (SPEC §4.1), and this one says the operator disabled the relay.
type disablingCloudly struct {
	ln         net.Listener
	pushed     atomic.Int64 // config pushes the relay answered
	nodeCalls  atomic.Int64 // node registrations that reached Cloudly
	registered atomic.Int64 // accepted relay registrations
}

func newDisablingCloudly(t *testing.T, cluster string) *disablingCloudly {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &disablingCloudly{ln: ln}
	push, _ := json.Marshal(map[string]any{"config": map[string]any{"clusterId": cluster, "relay": nil, "corestores": []any{}}})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		var conn *typedsocket.Conn
		conn = typedsocket.New(ws, typedsocket.Options{ReadLimit: 8 << 20, Handler: typedsocket.HandlerFunc(func(_ *typedsocket.Conn, req *typedsocket.Request) {
			switch req.Method {
			case contracts.MethodRegisterCloudlyClientSession:
				b, _ := json.Marshal(contracts.CloudlyClientSessionResponse{Protocol: contracts.RelayOffer})
				req.Respond(b)
			case contracts.MethodRegisterClusterRelay:
				b, _ := json.Marshal(contracts.RegisterClusterRelayResponse{Protocol: contracts.RelayOffer, Origin: "https://relay.example.org"})
				req.Respond(b)
				c.registered.Add(1)
				conn.CallAsync(contracts.MethodPushClusterRelayConfig, push, 0, func(rep typedsocket.Reply) {
					if rep.Err == nil {
						c.pushed.Add(1)
					}
				})
			case contracts.MethodRegisterPalletRuntimeSession:
				c.nodeCalls.Add(1)
				req.Fail(&typedsocket.Error{Text: "relay-cluster-not-enabled: this Cloudly would refuse too", Data: json.RawMessage("null")})
			default:
				req.Respond(json.RawMessage(`{}`))
			}
		})})
		conn.Run(context.Background())
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return c
}

// A pushClusterRelayConfig with relay: null is relay-cluster-not-enabled (SPEC §4.1): custody
// ends and new node registrations are refused by that name without asking Cloudly (SPEC §4.4).
// Cloudly pushes it right after accepting the registration; the relay reads the push on the
// socket's read loop before its session goroutine records the attachment, and recording the
// attachment then cleared the custody refusal the push had just set.
func TestRelayDisabledByThePushAfterAcceptanceStaysDisabled(t *testing.T) {
	c := newDisablingCloudly(t, "cluster-sim")
	token := filepath.Join(t.TempDir(), "jwt")
	os.WriteFile(token, []byte("jwt"), 0o600)
	cfg := relay.Config{ClusterID: "cluster-sim", NodeID: "relay-node", CloudlyURL: "ws://" + c.ln.Addr().String() + "/",
		CloudlyTokenFile: token, Listen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: "127.0.0.1:0"}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(cfg, relay.Features{}, zerolog.Nop(), relay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx) }()
	defer func() { cancel(); <-done }()

	for deadline := time.Now().Add(15 * time.Second); c.pushed.Load() < 1 || !r.Upstream().Attached(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the relay did not attach and answer the configuration push")
		}
	}
	n := sim.NewNode("node-a", zerolog.Nop())
	defer n.Close()
	if err := n.Connect(ctx5(t), "ws://"+r.DownstreamAddr().String()+"/"); err != nil {
		t.Fatal(err)
	}
	_, err = n.Register(ctx5(t))
	wantRefusal(t, err, contracts.RelayClusterNotEnabled)
	if got := c.nodeCalls.Load(); got != 0 {
		t.Fatalf("the disabled relay forwarded %d node registrations to Cloudly; custody was restored by the attach that preceded the push", got)
	}
}
