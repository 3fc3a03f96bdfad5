package typedsocket

import (
	"context"
	"encoding/json"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// When the peer starts the close handshake while the send loop is writing a corked burst, the
// WebSocket library writes its close reply (into the cork) and closes the socket at once: the
// reply and every frame of the burst the library already counts as written are thrown away, and
// the peer's clean close fails. Without the cork the same close completes.
func TestPeerCloseDuringCorkedBurstCompletesTheHandshake(t *testing.T) {
	for _, corked := range []bool{false, true} {
		name := "plain"
		if corked {
			name = "corked"
		}
		t.Run(name, func(t *testing.T) {
			const n = 20000
			first := make(chan struct{}) // the server has read the burst's first request: the burst is being written
			var once sync.Once
			srv, cli, _ := corkedPair(t, Options{MaxQueue: 2 * n, MaxInflight: 2 * n, Handler: HandlerFunc(func(_ *Conn, r *Request) { once.Do(func() { close(first) }) })},
				Options{MaxQueue: 2 * n})
			if !corked {
				cli.opts.Cork = nil
			}
			for range n {
				if _, err := cli.CallAsync("m", json.RawMessage(`{"x":"0123456789012345678901234567890123456789"}`), func(Reply) {}, Timeout(time.Minute)); err != nil {
					t.Fatal(err)
				}
			}
			go cli.Run(context.Background())
			<-first // TestCorkConnCloseSendsWhatItHolds pins the mechanism
			if err := srv.ws.Close(websocket.StatusNormalClosure, "bye"); err != nil {
				t.Fatalf("the peer's close handshake failed (corked=%v): %v", corked, err)
			}
		})
	}
}

// Closing a corked connection sends what it holds, then closes, as closing a socket sends what its
// kernel buffer holds.
func TestCorkConnCloseSendsWhatItHolds(t *testing.T) {
	wire, far := tcpPair(t)
	cc := NewCorkConn(wire)
	cc.Cork()
	if _, err := cc.Write([]byte("close reply")); err != nil {
		t.Fatal(err)
	}
	if err := cc.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(far); err != nil || string(b) != "close reply" {
		t.Fatalf("far end read %q, %v before EOF; want the held bytes", b, err)
	}
}
