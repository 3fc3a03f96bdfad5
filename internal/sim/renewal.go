package sim

import (
	"bytes"
	"encoding/json"
	"time"

	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// admittedRenewal is the newest DNS lease renewal the node admitted.
type admittedRenewal struct {
	sequence int64
	signed   []byte
}

type renewalWire struct {
	Signed struct {
		Renewal struct {
			Projection json.RawMessage `json:"projection"`
			Sequence   int64           `json:"sequence"`
			Digest     string          `json:"digest"`
			DNS        struct {
				IssuedAt  int64 `json:"issuedAt"`
				NotBefore int64 `json:"notBefore"`
				ExpiresAt int64 `json:"expiresAt"`
			} `json:"dns"`
		} `json:"renewal"`
	} `json:"signed"`
}

// admitRenewal plays the node's admitRuntimeNetworkDnsLeaseRenewal rules that a sender's timing
// must respect: the window must be current; a higher sequence is accepted, an equal one with
// byte-identical content is a replay, anything else is refused. It verifies no signature (the
// simulator holds no trust) and answers { status, renewal } with the renewal's reference.
func (n *Node) admitRenewal(body json.RawMessage) (json.RawMessage, error) {
	var w renewalWire
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, &typedsocket.Error{Text: "renewal-invalid: unreadable request", Data: json.RawMessage("null")}
	}
	signed := signedBytes(body)
	r := w.Signed.Renewal
	now := n.Now()
	if now < r.DNS.NotBefore || now >= r.DNS.ExpiresAt {
		return nil, &typedsocket.Error{Text: "renewal-not-current: the window is not current", Data: json.RawMessage("null")}
	}
	status := "accepted"
	n.mu.Lock()
	prev := n.renewal
	switch {
	case prev != nil && r.Sequence == prev.sequence && bytes.Equal(prev.signed, signed):
		status = "replay"
	case prev != nil && r.Sequence <= prev.sequence:
		n.mu.Unlock()
		return nil, &typedsocket.Error{Text: "renewal-stale: the sequence does not advance", Data: json.RawMessage("null")}
	default:
		n.renewal = &admittedRenewal{sequence: r.Sequence, signed: signed}
	}
	n.mu.Unlock()
	return json.Marshal(map[string]any{
		"status":  status,
		"renewal": map[string]any{"projection": r.Projection, "sequence": r.Sequence, "digest": r.Digest},
	})
}

func signedBytes(body json.RawMessage) []byte {
	var m map[string]json.RawMessage
	_ = json.Unmarshal(body, &m)
	return m["signed"]
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
