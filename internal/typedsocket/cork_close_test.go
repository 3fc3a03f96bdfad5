package typedsocket

import (
	"context"
	"encoding/json"
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
			srv, cli, _ := corkedPair(t, Options{MaxQueue: 2 * n, MaxInflight: 2 * n, Handler: HandlerFunc(func(_ *Conn, r *Request) {})},
				Options{MaxQueue: 2 * n})
			if !corked {
				cli.opts.Cork = nil
			}
			failures := 0
			for round := 0; round < 1; round++ {
				for i := 0; i < n; i++ {
					if err := cli.CallAsync("m", json.RawMessage(`{"x":"0123456789012345678901234567890123456789"}`), time.Minute, func(Reply) {}); err != nil {
						t.Fatal(err)
					}
				}
				go cli.Run(context.Background())
				time.Sleep(2 * time.Millisecond) // the burst is being written
				if err := srv.ws.Close(websocket.StatusNormalClosure, "bye"); err != nil {
					failures++
					t.Logf("the peer's close handshake failed: %v", err)
				}
			}
			if failures > 0 {
				t.Fatalf("close handshake failed (corked=%v)", corked)
			}
		})
	}
}
