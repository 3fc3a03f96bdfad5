package vpnhub

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// A message 1 seen once (the client verifies no certificate, so whoever sits on the path can read
// it inside QUIC) can be sent again later from anywhere: Noise IK's first message carries nothing
// fresh (SPEC §7's payload is { nodeId } alone, no timestamp as WireGuard's TAI64N), the hub
// accepts it, and "a second session for the same key replaces the first" closes the member's live
// session with vpn-member-replaced, after which Tunnel stops dialling for good. The replayer
// cannot read or send data (it lacks the ephemeral key), but it disconnects the member at will.
func TestReplayedMessage1DoesNotDisconnectTheMember(t *testing.T) {
	if os.Getenv("VPNHUB_SPEC_GAPS") == "" {
		t.Skip("a gap in SPEC §7 itself (message 1 carries nothing fresh); VPNHUB_SPEC_GAPS=1 runs it")
	}
	th := startHub(t, nil)
	k := testKey(t, 2)
	th.push(t, 1, testMember(k, "node-a", 2))
	_, captured, err := startHandshake(&k, th.key.Public, testAuthority, "node-a", nil) // an earlier session's message 1
	if err != nil {
		t.Fatal(err)
	}
	live := th.mustDial(t, k, "node-a")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	tr := &quic.Transport{Conn: udp}
	defer tr.Close()
	qc, err := tr.Dial(ctx, net.UDPAddrFromAddrPort(th.addr()), clientTLSConfig(), &quic.Config{EnableDatagrams: true})
	if err != nil {
		t.Fatal(err)
	}
	st, err := qc.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFrame(st, captured); err != nil {
		t.Fatal(err)
	}
	if _, err := readFrame(st, maxHandshakeMessage); err != nil {
		t.Logf("replay answered with %v", err)
	}
	select {
	case <-live.Done():
		t.Fatalf("a replayed message 1 closed the member's live session: %v", live.Err())
	case <-time.After(300 * time.Millisecond):
	}
}
