package vpnhub

import (
	"encoding/hex"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"code.foss.global/serve.zone/relay/contracts"
)

// The QUIC keys are HKDF-SHA256 of the hub's static private key, info serve.zone/relay-hub-reset
// and serve.zone/relay-hub-token, no salt. The golden vectors were computed apart from this code
// (RFC 5869 written out with Python's hmac module), so replicas built from another
// implementation derive the same keys.
func TestQUICKeysDeriveFromTheHubKey(t *testing.T) {
	for _, c := range []struct {
		key          byte
		reset, token string
	}{
		{1, "547ddc44b6d63631cb98418b48c70ca0f4fb1ba335907dea9fe32b969dacf9e6", "2d12be72d3f0be1e0f8122914ae3b9bf8a6d8eca3da9f6728f9a727c1ebbcc51"},
		{5, "43cf1df7d20cd1793f0b900a9b944ba2b615e4d57ccb5d9c1688a50abb374e6c", "f1cabe72f6c1f9fffdd841a6d917686d1a866d8d9a90609b0f78aea54c47ae45"},
	} {
		k := testKey(t, c.key)
		reset, token := quicKeys(&k)
		if got := hex.EncodeToString(reset[:]); got != c.reset {
			t.Errorf("key %d: reset key %s, want %s", c.key, got, c.reset)
		}
		if got := hex.EncodeToString(token[:]); got != c.token {
			t.Errorf("key %d: token key %s, want %s", c.key, got, c.token)
		}
		again, againToken := quicKeys(&k)
		if again != reset || againToken != token {
			t.Errorf("key %d: a second derivation differs", c.key)
		}
		if [32]byte(reset) == [32]byte(token) {
			t.Errorf("key %d: the reset and token keys are the same", c.key)
		}
	}
	a, b := testKey(t, 1), testKey(t, 5)
	ra, _ := quicKeys(&a)
	rb, _ := quicKeys(&b)
	if ra == rb {
		t.Fatal("two hub keys derive one reset key")
	}
}

// A standby's hub holds its membership but refuses every handshake (vpn-hub-standby) before any
// Noise work, and serves the membership the moment its relay leads.
func TestStandbyHubRefusesHandshakesUntilItLeads(t *testing.T) {
	checkLeaks(t)
	th := startHub(t, nil)
	ka := testKey(t, 2)
	th.push(t, 1, testMember(ka, "node-a", 2))
	th.Leading(false)
	if st := hubStatus(t, th, nil); st.Serving || st.Generation != 1 {
		t.Fatalf("a standby's status: %+v", st)
	}
	for range 2 {
		if _, err := th.dial(t, ka, "node-a", testAuthority); !errors.Is(err, contracts.VPNHubStandby) {
			t.Fatalf("a member dialling a standby: %v, want vpn-hub-standby", err)
		}
	}
	if got := th.handshakes(string(contracts.VPNHubStandby)); got != 2 {
		t.Fatalf("handshakes_total{vpn-hub-standby} = %v", got)
	}
	th.Leading(true)
	a := th.mustDial(t, ka, "node-a")
	if a.ControlAddress() != addrA || !hubStatus(t, th, nil).Serving {
		t.Fatalf("joined the leading hub at %s", a.ControlAddress())
	}
}

// A relay that stops leading (fenced) closes every session with vpn-hub-standby at once, so that
// its members redial through the Service to the new leader; its data plane forwards nothing
// meanwhile.
func TestFencedHubClosesEverySession(t *testing.T) {
	checkLeaks(t)
	p := startPair(t)
	p.th.Leading(false)
	if err := waitClosed(t, p.a); !errors.Is(err, contracts.VPNHubStandby) {
		t.Fatalf("node-a's session ended with %v, want vpn-hub-standby", err)
	}
	if err := waitClosed(t, p.b); !errors.Is(err, contracts.VPNHubStandby) {
		t.Fatalf("node-b's session ended with %v, want vpn-hub-standby", err)
	}
	if got := p.th.closes(string(contracts.VPNHubStandby)); got != 2 {
		t.Fatalf("session_closes_total{vpn-hub-standby} = %v", got)
	}
	if st := hubStatus(t, p.th, nil); st.Sessions != 0 || st.Serving || testutil.ToFloat64(p.th.m.sessions) != 0 {
		t.Fatalf("after fencing: %+v", st)
	}
	p.th.Leading(false) // told twice: nothing more happens
	if got := p.th.closes(string(contracts.VPNHubStandby)); got != 2 {
		t.Fatalf("session_closes_total{vpn-hub-standby} = %v after a second Leading(false)", got)
	}
}

// The data plane of a fenced hub drops what reaches it before its sessions are gone.
func TestFencedHubForwardsNothing(t *testing.T) {
	p := newPlane(t, 4)
	p.h.standby.Store(true)
	p.h.forward(p.a, p.fromA(ipv4Packet(addrA, addrB, []byte("after the fence"))))
	if p.b.queue.len() != 0 || testutil.ToFloat64(p.h.m.dropBy[dropStandby]) != 1 {
		t.Fatalf("a fenced hub forwarded: queue %d, standby drops %v", p.b.queue.len(), testutil.ToFloat64(p.h.m.dropBy[dropStandby]))
	}
}

// heldTenure is a relay's tenure as a test sets it.
type heldTenure struct{ held atomic.Bool }

func (t *heldTenure) Held() bool { return t.held.Load() }

// A hub whose relay's tenure has lapsed — a leader stopped and resumed before it noticed —
// forwards nothing and admits no handshake, though nobody has told it to stand by yet; once the
// tenure holds again it serves.
func TestHubServesOnlyWhileTheTenureHolds(t *testing.T) {
	p := newPlane(t, 4)
	var ten heldTenure
	p.h.UseTenure(&ten)
	p.h.forward(p.a, p.fromA(ipv4Packet(addrA, addrB, []byte("past the tenure"))))
	if p.b.queue.len() != 0 || testutil.ToFloat64(p.h.m.dropBy[dropStandby]) != 1 {
		t.Fatalf("forwarded past the tenure: queue %d, standby drops %v", p.b.queue.len(), testutil.ToFloat64(p.h.m.dropBy[dropStandby]))
	}
	ten.held.Store(true)
	p.h.forward(p.a, p.fromA(ipv4Packet(addrA, addrB, []byte("within it"))))
	if p.b.queue.len() != 1 {
		t.Fatalf("within the tenure: queue %d, want 1", p.b.queue.len())
	}

	checkLeaks(t)
	th := startHub(t, nil)
	th.UseTenure(&ten)
	ka := testKey(t, 2)
	th.push(t, 1, testMember(ka, "node-a", 2))
	ten.held.Store(false)
	if _, err := th.dial(t, ka, "node-a", testAuthority); !errors.Is(err, contracts.VPNHubStandby) {
		t.Fatalf("a member dialling a hub past its tenure: %v, want vpn-hub-standby", err)
	}
	ten.held.Store(true)
	th.mustDial(t, ka, "node-a")
}
