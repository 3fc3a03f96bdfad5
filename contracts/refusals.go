package contracts

import (
	"errors"
	"fmt"
	"strings"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// Named refusals. A refusal that crosses the wire is the error text "<name>: <reason>", its name
// one of the frozen vocabularies below; it may also travel as error data {"code": "<name>"}.
// Callers test a refusal with errors.Is(err, contracts.RelayNodeBusy), never by matching prose.
// A reason names what was wrong and never quotes a bearer, JWT, grant, key or body.

// RefusalName is the leading token of a named refusal. It is an error so that errors.Is can match
// any *Refusal carrying it.
type RefusalName string

func (n RefusalName) Error() string { return string(n) }

// Refuse returns a refusal under this name. The reason must name what was wrong without quoting
// a secret.
func (n RefusalName) Refuse(format string, args ...any) *Refusal {
	return &Refusal{Name: n, Reason: fmt.Sprintf(format, args...)}
}

// Refusal is a named refusal: Name plus a human reason.
type Refusal struct {
	Name   RefusalName
	Reason string
	// data, when set, is the error data the refusal travels with instead of {"code": name}: the
	// shape a seed gives the refusal of one call (IngressRegistrationRefusal). Name stays the
	// relay's own cause, in the text and for errors.Is on this side.
	data []byte
}

func (r *Refusal) Error() string { return string(r.Name) + ": " + r.Reason }

// Is matches the refusal's name, so errors.Is(err, contracts.EscrowRunStale) holds for every
// escrow-run-stale refusal.
func (r *Refusal) Is(target error) bool {
	n, ok := target.(RefusalName)
	return ok && n == r.Name
}

// Data is the error data a refusal travels with: {"code": "<name>"}, or the seed's shape the
// refusal was given (IngressRegistrationRefusal).
func (r *Refusal) Data() []byte {
	if r.data != nil {
		return r.data
	}
	return append(strictjson.AppendString([]byte(`{"code":`), string(r.Name)), '}')
}

// ReadRefusalName reads the name of a refusal received as an error: error data {"code": name}
// first, else the leading "<name>:" token of the text. It answers "" when neither names one.
// A refusal name is lowercase letters, digits and hyphens.
func ReadRefusalName(text string, data []byte) RefusalName {
	if strictjson.KindOf(data) == strictjson.KindObject {
		if raw, ok, err := strictjson.Lookup(data, "code"); err == nil && ok {
			if code, err := strictjson.ReadString(raw); err == nil && isRefusalToken(code) {
				return RefusalName(code)
			}
		}
	}
	if name, _, ok := strings.Cut(text, ":"); ok && isRefusalToken(name) {
		return RefusalName(name)
	}
	return ""
}

// RefusalLabel names err for a metric label or a log field: the refusal name it carries — a
// *Refusal's name, protocol-incompatible for a *ProtocolRefusal, or the name a remote error
// states through a Name() RefusalName method (typedsocket.Error has one) — when that name belongs
// to a vocabulary of this package; "other" for a name outside them (a peer can put any token in
// its error text), for an error that names none, and for a local fault; "" for nil. Label values
// are fixed sets (docs/hostile.md): what a peer sends never adds a series or reaches a log line as text.
func RefusalLabel(err error) string {
	if err == nil {
		return ""
	}
	var r *Refusal
	var pr *ProtocolRefusal
	var named interface{ Name() RefusalName }
	var n RefusalName
	switch {
	case errors.As(err, &r):
		n = r.Name
	case errors.As(err, &pr):
		n = ProtocolIncompatibleCode
	case errors.As(err, &named):
		n = named.Name()
	}
	if knownRefusals[n] {
		return string(n)
	}
	return RefusalLabelOther
}

// RefusalLabelOther is RefusalLabel's label for every error without a known refusal name.
const RefusalLabelOther = "other"

// knownRefusals are the names RefusalLabel passes on: every vocabulary below, and the codes of
// the two seed refusals that travel as error data.
var knownRefusals = func() map[RefusalName]bool {
	m := map[RefusalName]bool{ProtocolIncompatibleCode: true, ClusterIngressRegistrationRefusedCode: true}
	for _, vocabulary := range [][]RefusalName{clusterRelayUndispatchedRefusals[:], holdRuntimeNetworkDnsLeaseRenewalsRefusals[:],
		isolatedRestoreNodeControlRefusals[:], relayRefusals[:], vpnRefusals[:]} {
		for _, n := range vocabulary {
			m[n] = true
		}
	}
	return m
}()

func isRefusalToken(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// InvalidError is a body that failed a validator: one named reason per violation.
type InvalidError struct{ Reasons []string }

func (e *InvalidError) Error() string { return strings.Join(e.Reasons, "; ") }

// Seed-defined: data.clusterRelayUndispatchedRefusals, the three registration refusals that end a
// relay's custody. Any other refusal states nothing about dispatch.
const (
	RelayClusterNotEnabled    RefusalName = "relay-cluster-not-enabled"
	RelayNodeForeign          RefusalName = "relay-node-foreign"
	RelaySequenceNotAdvancing RefusalName = "relay-sequence-not-advancing"
)

var clusterRelayUndispatchedRefusals = [...]RefusalName{RelayClusterNotEnabled, RelayNodeForeign, RelaySequenceNotAdvancing}

// ClusterRelayUndispatchedRefusals is data.clusterRelayUndispatchedRefusals (a copy).
func ClusterRelayUndispatchedRefusals() [3]RefusalName { return clusterRelayUndispatchedRefusals }

// IsUndispatchedRefusal reports whether n is one of the three custody-ending refusals.
func IsUndispatchedRefusal(n RefusalName) bool {
	for _, u := range clusterRelayUndispatchedRefusals {
		if u == n {
			return true
		}
	}
	return false
}

// Seed-defined: data.holdRuntimeNetworkDnsLeaseRenewalsRefusals, in the seed's order.
const (
	EscrowRunInvalid        RefusalName = "escrow-run-invalid"
	EscrowNodeNotCarried    RefusalName = "escrow-node-not-carried"
	EscrowRunForeignSession RefusalName = "escrow-run-foreign-session"
	EscrowRunStale          RefusalName = "escrow-run-stale"
	EscrowRunUnordered      RefusalName = "escrow-run-unordered"
	EscrowCloudlyOnly       RefusalName = "escrow-cloudly-only"
)

var holdRuntimeNetworkDnsLeaseRenewalsRefusals = [...]RefusalName{
	EscrowRunInvalid, EscrowNodeNotCarried, EscrowRunForeignSession, EscrowRunStale, EscrowRunUnordered, EscrowCloudlyOnly,
}

// HoldRuntimeNetworkDnsLeaseRenewalsRefusals is data.holdRuntimeNetworkDnsLeaseRenewalsRefusals.
func HoldRuntimeNetworkDnsLeaseRenewalsRefusals() [6]RefusalName {
	return holdRuntimeNetworkDnsLeaseRenewalsRefusals
}

// Seed-defined: data.isolatedRestoreNodeControlRefusals. restore-node-refused is followed by
// Corestore's own reason.
const (
	RestoreNodeNotCarried  RefusalName = "restore-node-not-carried"
	RestoreNodeUnreachable RefusalName = "restore-node-unreachable"
	RestoreNodeRefused     RefusalName = "restore-node-refused"
)

var isolatedRestoreNodeControlRefusals = [...]RefusalName{RestoreNodeNotCarried, RestoreNodeUnreachable, RestoreNodeRefused}

// IsolatedRestoreNodeControlRefusals is data.isolatedRestoreNodeControlRefusals.
func IsolatedRestoreNodeControlRefusals() [3]RefusalName { return isolatedRestoreNodeControlRefusals }

// Seed-defined: the cluster ingress registration refusal (clusteringress.ts). It travels as error
// data IClusterIngressRegistrationRefusal { code, reason, retryAfterMs }, forwarded untouched.
const (
	ClusterIngressRegistrationRefusedCode = "cluster-ingress-registration-refused"
	ClusterIngressMinimumRetryAfterMs     = 1_000
	ClusterIngressMaximumRetryAfterMs     = 300_000
)

var clusterIngressRegistrationRefusalReasons = [...]string{
	"not-ready",
	"registration-invalid",
	"relay-not-connected",
	"ingress-not-designated",
	"node-mismatch",
	"assignment-not-running",
	"bearer-refused",
	"conflict",
}

// ClusterIngressRegistrationRefusalReasons is clusterIngressRegistrationRefusalReasons, in the
// order Cloudly judges them.
func ClusterIngressRegistrationRefusalReasons() [8]string {
	return clusterIngressRegistrationRefusalReasons
}

// Project-defined relay refusals (docs/protocol.md#framing-typedrequest-over-websocket, docs/protocol.md#upstream-session, docs/protocol.md#node-runtime-sessions, docs/protocol.md#vpn-hub and docs/protocol.md#cluster-ingress).
const (
	// A request whose method the receiver does not serve.
	RelayMethodUnknown RefusalName = "relay-method-unknown"
	// A node → Cloudly request while the relay has no attached Cloudly session, or one in
	// flight when the session was lost.
	RelayUpstreamDetached RefusalName = "relay-upstream-detached"
	// A Cloudly → node request for a node this relay does not carry.
	RelayNodeNotCarried RefusalName = "relay-node-not-carried"
	// A node → Cloudly request from a connection that is not that node's.
	RelaySessionForeign RefusalName = "relay-session-foreign"
	// A request for a node whose send queue is full.
	RelayNodeBusy RefusalName = "relay-node-busy"
	// Exec, volume archives and bindPalletLocalRuntimeController: never across the relay.
	RelayMethodLocalOnly RefusalName = "relay-method-local-only"
	// An ingress-only method from a connection that is not an accepted ingress.
	RelayIngressOnly RefusalName = "relay-ingress-only"
	// pushClusterVpnMembership to a relay whose hub is off.
	RelayVPNHubOff RefusalName = "relay-vpn-hub-off"
	// A body the relay must read (an offer, a session, a node id) that is not readable.
	RelayRequestInvalid RefusalName = "relay-request-invalid"
	// A forwarded request whose answer did not come within the relay's call timeout.
	RelayCallTimeout RefusalName = "relay-call-timeout"
	// A node → Cloudly request while the upstream socket's send queue is full.
	RelayUpstreamBusy RefusalName = "relay-upstream-busy"
	// A VirtualStream frame naming a stream the relay never bound to the sender's side (docs/protocol.md#streams).
	RelayStreamUnknown RefusalName = "relay-stream-unknown"
	// A VirtualStream frame from Cloudly for a stream whose node connection has ended (docs/protocol.md#streams).
	RelayStreamGone RefusalName = "relay-stream-gone"
	// A platform closure (a database backup or restore) that moved no byte for the no-byte
	// bound (30 s by default): ended, and answered to the side waiting for it.
	RelayClosureStalled RefusalName = "relay-closure-stalled"
)

var relayRefusals = [...]RefusalName{
	RelayMethodUnknown, RelayUpstreamDetached, RelayNodeNotCarried, RelaySessionForeign, RelayNodeBusy,
	RelayMethodLocalOnly, RelayIngressOnly, RelayVPNHubOff, RelayRequestInvalid, RelayCallTimeout, RelayUpstreamBusy,
	RelayStreamUnknown, RelayStreamGone, RelayClosureStalled,
}

// RelayRefusals lists the project-defined relay refusal names.
func RelayRefusals() [14]RefusalName { return relayRefusals }

// TypedRequestNoMethodText is the error text the published TypedRequest library
// (@api.global/typedrequest 3.3.0) answers a request with when its router has no handler for the
// method: what a real peer that does not know a method says, in place of relay-method-unknown.
// It names no refusal, so it is matched whole.
const TypedRequestNoMethodText = "There is no available method for this call on the server side"

// Project-defined VPN hub refusals (docs/protocol.md#vpn-hub): the reason phrase of the QUIC application close
// (error code 1) starts with one of them.
const (
	VPNMemberUnknown      RefusalName = "vpn-member-unknown"
	VPNMemberExpired      RefusalName = "vpn-member-expired"
	VPNMemberNodeMismatch RefusalName = "vpn-member-node-mismatch"
	VPNAuthorityMismatch  RefusalName = "vpn-authority-mismatch"
	VPNMemberRemoved      RefusalName = "vpn-member-removed"
	VPNMemberReplaced     RefusalName = "vpn-member-replaced"
	// VPNHandshakeReplayed is a message 1 whose timestamp is not greater than the last one the
	// hub accepted for its key.
	VPNHandshakeReplayed RefusalName = "vpn-handshake-replayed"
	// VPNSessionSilent is a session that delivered no authenticated datagram within
	// VPNSilentTimeout of its handshake.
	VPNSessionSilent RefusalName = "vpn-session-silent"
	// VPNHubStandby is a hub whose relay is not the elected one of its cluster (several relays
	// per cluster): it refuses every handshake, and closes every session when its relay stops
	// leading, so that members redial through the Service to the relay that leads.
	VPNHubStandby RefusalName = "vpn-hub-standby"
)

var vpnRefusals = [...]RefusalName{
	VPNMemberUnknown, VPNMemberExpired, VPNMemberNodeMismatch, VPNAuthorityMismatch, VPNMemberRemoved, VPNMemberReplaced,
	VPNHandshakeReplayed, VPNSessionSilent, VPNHubStandby,
}

// VPNRefusals lists the hub's refusal names.
func VPNRefusals() [9]RefusalName { return vpnRefusals }
