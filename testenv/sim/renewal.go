package sim

import (
	"bytes"
	"encoding/json"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// admittedRenewal is the newest DNS lease renewal the node admitted.
type admittedRenewal struct {
	sequence int64
	window   contracts.DnsWindow
	signed   []byte
}

// renewalWire is the part of an apply request CountRenewals records (best effort, any body).
type renewalWire struct {
	Signed struct {
		Renewal struct {
			Sequence int64 `json:"sequence"`
		} `json:"renewal"`
	} `json:"signed"`
}

func renewalRefused(text string) error {
	return &typedsocket.Error{Text: text, Data: json.RawMessage("null")}
}

// admitRenewal plays the node's side of applyRuntimeNetworkDnsLeaseRenewal (seed:
// bindApplyRuntimeNetworkDnsLeaseRenewalRequest, then admitRuntimeNetworkDnsLeaseRenewal):
//   - the request is exactly { session, signed };
//   - session is the node's current session binding ("requires the node's current
//     physical-session binding", whoever sent it: a relay pushes under the binding the node
//     obtained itself);
//   - signed is an exact ISignedRuntimeNetworkDnsLeaseRenewal whose renewal's digest verifies
//     under the node's rule (RenewalPreimage), in that session's scope (controller, nodeId,
//     runtimeNamespace);
//   - an equal sequence with byte-identical content is a replay, whatever now is; otherwise the
//     window must be current (notBefore <= now < expiresAt), the sequence higher than the
//     previous one, and the window must not move issuedAt back and must end later.
//
// It verifies no signature (the simulator holds no trust) and answers { status, renewal } with
// the renewal's reference.
func (n *Node) admitRenewal(body json.RawMessage) (json.RawMessage, error) {
	var sessionRaw, signedRaw []byte
	if strictjson.ReadExact(body, strictjson.Req("session", &sessionRaw), strictjson.Req("signed", &signedRaw)) != nil {
		return nil, renewalRefused("renewal-invalid: the request must be exactly { session, signed }")
	}
	n.mu.Lock()
	current := n.session
	n.mu.Unlock()
	if current == nil || !contracts.EqualJSON(sessionRaw, current) {
		return nil, renewalRefused("session-mismatch: the request does not carry the node's current session binding")
	}
	session, err := contracts.ReadRuntimeSession(current)
	if err != nil {
		return nil, renewalRefused("session-mismatch: the node's session binding is unreadable")
	}
	signed, err := contracts.ReadSignedRuntimeNetworkDnsLeaseRenewal(signedRaw)
	if err != nil {
		return nil, renewalRefused("renewal-invalid: " + err.Error())
	}
	// The node verifies the digest under its own (its Cloudly's) rule: the authority the relay
	// defers to when its assumed rule does not reproduce a digest.
	renewalRaw, _, _ := strictjson.Lookup(signedRaw, "renewal")
	if d, err := renewalDigest(n.RenewalPreimage, renewalRaw); err != nil || d != signed.Renewal.Digest {
		return nil, renewalRefused("renewal-invalid: the renewal's digest does not verify")
	}
	r := signed.Renewal
	if r.NodeID != session.NodeID || r.RuntimeNamespace != session.RuntimeNamespace || !contracts.EqualJSON(r.Controller, session.Controller) {
		return nil, renewalRefused("renewal-foreign-scope: the renewal is not in the session's scope")
	}
	reference := func(status string) (json.RawMessage, error) {
		return json.Marshal(map[string]any{
			"status": status,
			"renewal": map[string]any{"projection": map[string]any{
				"id": r.Projection.ID, "generation": r.Projection.Generation, "digest": r.Projection.Digest,
			}, "sequence": r.Sequence, "digest": r.Digest},
		})
	}
	now := n.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	prev := n.renewal
	switch {
	case prev != nil && r.Sequence == prev.sequence && bytes.Equal(prev.signed, signedRaw):
		return reference(contracts.ApplyStatusReplay)
	case !r.Dns.Current(now):
		return nil, renewalRefused("renewal-not-current: the window is not current")
	case prev != nil && r.Sequence <= prev.sequence:
		return nil, renewalRefused("renewal-stale: the sequence does not advance")
	case prev != nil && (r.Dns.IssuedAt < prev.window.IssuedAt || r.Dns.ExpiresAt <= prev.window.ExpiresAt):
		return nil, renewalRefused("renewal-window-regressed: the window must not move issuedAt back and must end later")
	}
	n.renewal = &admittedRenewal{sequence: r.Sequence, window: r.Dns, signed: append([]byte(nil), signedRaw...)}
	return reference(contracts.ApplyStatusAccepted)
}

// AdmittedRenewalSequence is the sequence of the newest admitted renewal, or 0.
func (n *Node) AdmittedRenewalSequence() int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.renewal == nil {
		return 0
	}
	return n.renewal.sequence
}

func nowMillis() int64 { return time.Now().UnixMilli() }
