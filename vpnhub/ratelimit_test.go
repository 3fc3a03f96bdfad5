package vpnhub

import (
	"net/netip"
	"testing"
	"time"
)

func TestHandshakeLimiterIsNeverStricterThanWireGuard(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newHandshakeLimiter(1, 1, 1e6, 1e6, func() time.Time { return now }) // asked for stricter: raised
	a := netip.MustParseAddr("192.0.2.7")
	for i := 0; i < 5; i++ {
		if !l.allow(a) {
			t.Fatalf("burst of 5 refused at %d", i)
		}
	}
	if l.allow(a) {
		t.Fatal("a sixth handshake in the same instant passed")
	}
	now = now.Add(50 * time.Millisecond) // 20 per second: one token
	if !l.allow(a) || l.allow(a) {
		t.Fatal("the bucket does not refill at 20 per second")
	}
	if !l.allow(netip.MustParseAddr("192.0.2.8")) {
		t.Fatal("one source's flood limited another source")
	}
}

// The global bucket turns on Retry under load; it refuses no source within its own limit (
// docs/protocol.md#vpn-hub: never more strictly than 20/s, burst 5 per source). Beyond maxTrackedSources, sources share
// the overflow bucket.
func TestHandshakeLimiterGlobalLoadTurnsOnRetry(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newHandshakeLimiter(20, 5, 10, 10, func() time.Time { return now })
	passed := 0
	for i := 0; i < 10_000; i++ {
		if l.allow(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})) {
			passed++
		}
	}
	if want := maxTrackedSources + DefaultHandshakeBurst; passed != want {
		t.Fatalf("%d handshakes from 10 000 fresh sources passed; want %d", passed, want)
	}
	if !l.underPressure() {
		t.Fatal("an empty global bucket is not pressure: spoofed floods would not be asked for a Retry")
	}
	if len(l.sources) > maxTrackedSources {
		t.Fatalf("tracking %d sources", len(l.sources))
	}
}
