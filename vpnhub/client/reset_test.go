package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/backoff"
)

// logBuffer is a zerolog writer the test reads back.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines is every logged line with message msg, decoded.
func (b *logBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if m["message"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// A failover as a member sees it: its hub's replicas share the hub key, so when the path takes the
// member's packets to another replica (the Service now selects the new leader), that replica
// answers the connection it does not know with a stateless reset the member believes. The
// session ends at once with quic-go's StatelessResetError, and the tunnel redials after the
// schedule's first wait however many waits came before: a reset says the hub lost the session's
// state, not that the member should keep off. Before it leads, the other replica refuses the
// member's handshakes (vpn-hub-standby), which is where the tunnel's schedule climbs here.
func TestTunnelRejoinsAnotherReplicaAfterItsStatelessReset(t *testing.T) {
	checkLeaks(t)
	ka, kb := testKey(t, 2), testKey(t, 3)
	members := []contracts.VPNMember{testMember(ka, "node-a", 2), testMember(kb, "node-b", 3)}
	old, next := startHub(t, members...), startHub(t, members...) // one hub key, as replicas hold it
	next.Leading(false)
	path := newUDPProxy(t, next.Addr())

	var logs logBuffer
	dev := newMemDevice()
	joins := make(chan *Conn, 8)
	tu := &Tunnel{Client: old.client(t, ka, "node-a", path.addr(), nil), Device: dev,
		Logger: zerolog.New(&logs), OnJoin: func(c *Conn) { joins <- c }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tu.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	eventually(t, "four handshakes refused by the standby", func() bool {
		return len(logs.lines(t, "vpn session down")) >= 4
	})
	for _, l := range logs.lines(t, "vpn session down") {
		if l["outcome"] != string(contracts.VPNHubStandby) {
			t.Fatalf("a standby's refusal logged as %v", l)
		}
	}
	path.switchTo(old.Addr())
	first := joined(t, joins, 60*time.Second)
	b := old.dial(t, kb, "node-b")
	dev.in <- ipv4Packet(addrA, addrB, []byte("before the failover"))
	if receiveWithin(b, 5*time.Second) == nil {
		t.Fatal("b received nothing before the failover")
	}

	next.Leading(true)
	path.switchTo(next.Addr()) // the old leader is gone from the path; its process may as well be
	downs := len(logs.lines(t, "vpn session down"))
	dev.in <- ipv4Packet(addrA, addrB, []byte("into the new replica"))
	select {
	case <-first.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the session on the old replica was not reset by the new one")
	}
	var reset *quic.StatelessResetError
	if err := first.Err(); !errors.As(err, &reset) {
		t.Fatalf("the session ended with %v, want a stateless reset", err)
	}
	second := joined(t, joins, 30*time.Second)
	if second.ControlAddress() != addrA || next.metric(t, "relay_vpnhub_sessions") != 1 {
		t.Fatalf("rejoined at %s; the new replica has %v sessions", second.ControlAddress(), next.metric(t, "relay_vpnhub_sessions"))
	}
	after := logs.lines(t, "vpn session down")[downs:]
	if len(after) == 0 || after[0]["outcome"] != "hub-reset" {
		t.Fatalf("the reset logged as %v", after)
	}
	if wait, _ := after[0]["wait"].(float64); time.Duration(wait*float64(time.Millisecond)) > backoff.Base {
		t.Fatalf("after a stateless reset the tunnel waited %v ms, more than the schedule's first wait %s", wait, backoff.Base)
	}
}
