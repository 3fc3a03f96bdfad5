package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/escrow"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
)

// eagerCloudly is a Cloudly peer on loopback that, right after accepting the relay's
// registration, sends holdRuntimeNetworkDnsLeaseRenewals on the same socket — as Cloudly may:
// the relay is attached from the moment its registration is accepted (SPEC §4.3). It records the
// answer to each hold and then drops the socket so that the relay attaches again.
type eagerCloudly struct {
	ln  net.Listener
	srv *http.Server

	mu      sync.Mutex
	answers []error
}

func newEagerCloudly(t *testing.T) *eagerCloudly {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &eagerCloudly{ln: ln}
	c.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
				// Accepted: the relay is attached. A clearing hold for a node.
				conn.CallAsync(contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, json.RawMessage(`{}`), 0, func(rep typedsocket.Reply) {
					c.mu.Lock()
					c.answers = append(c.answers, rep.Err)
					c.mu.Unlock()
					go conn.CloseNow()
				})
			default:
				req.Respond(json.RawMessage(`{}`))
			}
		})})
		conn.Run(context.Background())
	})}
	go c.srv.Serve(ln)
	t.Cleanup(func() { c.srv.Close() })
	return c
}

func (c *eagerCloudly) results() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.answers...)
}

// A request Cloudly sends right after accepting the relay's registration must be served as coming
// from the attached session. The relay reads it on the socket's read loop before the session
// goroutine has recorded the attachment, and escrow refuses it as not from Cloudly.
func TestRequestRightAfterAcceptedRegistrationIsFromTheAttachedSession(t *testing.T) {
	c := newEagerCloudly(t)
	token := filepath.Join(t.TempDir(), "jwt")
	os.WriteFile(token, []byte("jwt"), 0o600)
	cfg := relay.Config{ClusterID: "cluster-sim", NodeID: "relay-node", CloudlyURL: "ws://" + c.ln.Addr().String() + "/",
		CloudlyTokenFile: token, Listen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: "127.0.0.1:0"}
	if err := cfg.Complete(); err != nil {
		t.Fatal(err)
	}
	esc, err := escrow.New(escrow.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(cfg, relay.Features{Escrow: esc}, zerolog.Nop(), relay.Options{})
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

	const attaches = 5
	for deadline := time.Now().Add(20 * time.Second); len(c.results()) < attaches; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d attaches", len(c.results()))
		}
	}
	refused := 0
	for _, err := range c.results()[:attaches] {
		if errors.Is(err, contracts.EscrowCloudlyOnly) {
			refused++
		}
	}
	if refused > 0 {
		t.Fatalf("%d of %d holds sent on the attached session just after its registration was accepted were refused %s",
			refused, attaches, contracts.EscrowCloudlyOnly)
	}
}
