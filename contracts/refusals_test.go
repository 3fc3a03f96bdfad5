package contracts

import (
	"errors"
	"fmt"
	"testing"
)

func TestVocabulariesAreTheSeedNamesInOrder(t *testing.T) {
	if got := ClusterRelayUndispatchedRefusals(); got != [3]RefusalName{"relay-cluster-not-enabled", "relay-node-foreign", "relay-sequence-not-advancing"} {
		t.Errorf("undispatched = %v", got)
	}
	if got := HoldRuntimeNetworkDnsLeaseRenewalsRefusals(); got != [6]RefusalName{"escrow-run-invalid", "escrow-node-not-carried",
		"escrow-run-foreign-session", "escrow-run-stale", "escrow-run-unordered", "escrow-cloudly-only"} {
		t.Errorf("escrow = %v", got)
	}
	if got := IsolatedRestoreNodeControlRefusals(); got != [3]RefusalName{"restore-node-not-carried", "restore-node-unreachable", "restore-node-refused"} {
		t.Errorf("restore = %v", got)
	}
	if got := ClusterIngressRegistrationRefusalReasons(); got != [8]string{"not-ready", "registration-invalid", "relay-not-connected",
		"ingress-not-designated", "node-mismatch", "assignment-not-running", "bearer-refused", "conflict"} {
		t.Errorf("ingress = %v", got)
	}
	if got := VPNRefusals(); got != [9]RefusalName{"vpn-member-unknown", "vpn-member-expired", "vpn-member-node-mismatch",
		"vpn-authority-mismatch", "vpn-member-removed", "vpn-member-replaced", "vpn-handshake-replayed", "vpn-session-silent",
		"vpn-hub-standby"} {
		t.Errorf("vpn = %v", got)
	}
	// A copy cannot change the vocabulary.
	v := ClusterRelayUndispatchedRefusals()
	v[0] = "changed"
	if ClusterRelayUndispatchedRefusals()[0] != RelayClusterNotEnabled {
		t.Error("the vocabulary is not frozen")
	}
	for _, n := range RelayRefusals() {
		if !isRefusalToken(string(n)) || n[:6] != "relay-" {
			t.Errorf("relay refusal %q is not a relay- token", n)
		}
	}
}

func TestRefusalMatchesByName(t *testing.T) {
	err := fmt.Errorf("forward: %w", RelayNodeBusy.Refuse("send queue of node %s is full", "node-a"))
	if !errors.Is(err, RelayNodeBusy) || errors.Is(err, RelayNodeNotCarried) {
		t.Fatal("errors.Is does not match by name")
	}
	var r *Refusal
	if !errors.As(err, &r) || r.Error() != "relay-node-busy: send queue of node node-a is full" {
		t.Fatalf("refusal = %v", r)
	}
	if string(r.Data()) != `{"code":"relay-node-busy"}` {
		t.Fatalf("data = %s", r.Data())
	}
	if !IsUndispatchedRefusal(RelaySequenceNotAdvancing) || IsUndispatchedRefusal(RelayNodeBusy) {
		t.Fatal("IsUndispatchedRefusal")
	}
}

func TestReadRefusalName(t *testing.T) {
	cases := []struct {
		text, data string
		want       RefusalName
	}{
		{"relay-node-foreign: node-x is not in cluster c", "null", "relay-node-foreign"},
		{"could not verify", `{"code":"relay-cluster-not-enabled"}`, "relay-cluster-not-enabled"},
		{"Something Broke: at line 3", "null", ""},
		{"no colon here", "", ""},
		{"escrow-run-stale: last window ended", `{"code":7}`, "escrow-run-stale"},
	}
	for _, c := range cases {
		if got := ReadRefusalName(c.text, []byte(c.data)); got != c.want {
			t.Errorf("ReadRefusalName(%q, %s) = %q, want %q", c.text, c.data, got, c.want)
		}
	}
}

// remoteError stands for typedsocket.Error: an error whose name a peer wrote.
type remoteError struct{ text string }

func (e remoteError) Error() string     { return e.text }
func (e remoteError) Name() RefusalName { return ReadRefusalName(e.text, nil) }

func TestRefusalLabel(t *testing.T) {
	pr, _ := NegotiateProtocol(RelayOffer, ProtocolOffer{InterfacesVersion: "33.0.0", MinimumPeerVersion: "33.0.0"})
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{RelayNodeBusy.Refuse("full"), "relay-node-busy"},
		{fmt.Errorf("forward: %w", EscrowRunStale.Refuse("old")), "escrow-run-stale"},
		{pr, "protocol-incompatible"},
		{remoteError{"restore-node-refused: disk full"}, "restore-node-refused"},
		{remoteError{DescribeProtocolRefusal(*pr)}, "protocol-incompatible"},
		{remoteError{"cluster-ingress-registration-refused: bearer-refused"}, "cluster-ingress-registration-refused"},
		{remoteError{"vpn-member-unknown: no such key"}, "vpn-member-unknown"},
		// A name the peer made up, no name at all, and a local fault: one fixed label.
		{remoteError{"made-up-name-1234: whatever the peer likes"}, "other"},
		{remoteError{"There is no available method for this call on the server side"}, "other"},
		{RefusalName("not-a-relay-name").Refuse("x"), "other"},
		{errors.New("dial tcp: connection refused"), "other"},
	} {
		if got := RefusalLabel(c.err); got != c.want {
			t.Errorf("RefusalLabel(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// TestClosureStalledIsARelayRefusal: the platform agent's no-byte bound names its refusal with a
// relay- token of the relay vocabulary, so metrics and logs label it by name, not "other".
func TestClosureStalledIsARelayRefusal(t *testing.T) {
	if RelayClosureStalled != "relay-closure-stalled" {
		t.Fatalf("name %q", RelayClosureStalled)
	}
	found := false
	for _, n := range RelayRefusals() {
		found = found || n == RelayClosureStalled
	}
	if !found {
		t.Fatal("relay-closure-stalled is not in the relay vocabulary")
	}
	err := fmt.Errorf("backup: %w", RelayClosureStalled.Refuse("Corestore sent nothing of the closure for %s", "30s"))
	if got := RefusalLabel(err); got != "relay-closure-stalled" {
		t.Fatalf("label %q", got)
	}
	if ReadRefusalName(err.Error()[len("backup: "):], nil) != RelayClosureStalled {
		t.Fatal("the refusal's text does not name it")
	}
}
