package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// EscrowRun is a run of DNS lease renewals the simulated Cloudly signs ahead of time for one node:
// what holdRuntimeNetworkDnsLeaseRenewals carries. The simulator holds no key, so authority and
// signature are opaque placeholders; the digests are real.
type EscrowRun struct {
	Session       json.RawMessage               // the node's session binding (Node.Session())
	Start         time.Time                     // the first window's slot
	Count         int                           // renewals (default 23)
	Step          time.Duration                 // from one slot to the next (default 10 min)
	Window        time.Duration                 // each window's length, at most 15 min (default 15 min)
	FirstSequence int64                         // default 1
	Projection    contracts.ProjectionReference // default derived from the node id
	// Preimage, when set, is what this Cloudly hashes for a renewal's digest, given the canonical
	// JSON of the renewal without digest: a Cloudly whose rule is not the relay's assumed one (the
	// seeds do not spell it). nil: the relay's rule (contracts.SealRuntimeNetworkDnsLeaseRenewal).
	Preimage func(canonical []byte) []byte
}

// PreimageWithoutNewline is a digest preimage other than the relay's assumed one: the domain and
// the canonical renewal with no "\n" between them.
func PreimageWithoutNewline(canonical []byte) []byte {
	return append([]byte(contracts.RuntimeNetworkDnsLeaseRenewalDigestDomain), canonical...)
}

// renewalDigest is the digest of the renewal object raw (its digest member ignored) under preimage;
// nil preimage is the relay's rule.
func renewalDigest(preimage func([]byte) []byte, raw []byte) (string, error) {
	if preimage == nil {
		return contracts.ComputeRuntimeNetworkDnsLeaseRenewalDigest(raw)
	}
	c, err := strictjson.CanonicalWithout(raw, "digest")
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(preimage(c))
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// Request builds the hold request: one node, one projection, one authority revision, in the
// session's scope, sequences ascending by one, window i from Start + i·Step.
func (r EscrowRun) Request() (json.RawMessage, error) {
	h, err := r.build()
	if err != nil {
		return nil, err
	}
	return h.AppendJSON(nil), nil
}

// Windows are the run's windows, in order.
func (r EscrowRun) Windows() []contracts.DnsWindow {
	r.fill()
	out := make([]contracts.DnsWindow, r.Count)
	for i := range out {
		slot := r.Start.Add(time.Duration(i) * r.Step).UnixMilli()
		out[i] = contracts.DnsWindow{IssuedAt: slot, NotBefore: slot, ExpiresAt: slot + r.Window.Milliseconds()}
	}
	return out
}

func (r *EscrowRun) fill() {
	if r.Count == 0 {
		r.Count = 23
	}
	if r.Step == 0 {
		r.Step = 10 * time.Minute
	}
	if r.Window == 0 {
		r.Window = 15 * time.Minute
	}
	if r.FirstSequence == 0 {
		r.FirstSequence = 1
	}
}

func (r EscrowRun) build() (*contracts.HoldRuntimeNetworkDnsLeaseRenewalsRequest, error) {
	r.fill()
	s, err := contracts.ReadRuntimeSession(r.Session)
	if err != nil {
		return nil, fmt.Errorf("sim escrow run: %w", err)
	}
	if r.Projection == (contracts.ProjectionReference{}) {
		r.Projection = contracts.ProjectionReference{ID: "projection-" + strings.TrimLeft(s.NodeID, "-_"), Generation: 1,
			Digest: contracts.Digest("sim-projection", []byte(`"`+s.NodeID+`"`))}
	}
	h := &contracts.HoldRuntimeNetworkDnsLeaseRenewalsRequest{NodeID: s.NodeID, Projection: r.Projection}
	for i, w := range r.Windows() {
		renewal := contracts.RuntimeNetworkDnsLeaseRenewal{
			Controller: s.Controller, NodeID: s.NodeID, RuntimeNamespace: s.RuntimeNamespace,
			Projection: r.Projection, Sequence: r.FirstSequence + int64(i), Dns: w, Digest: "sha256:" + strings.Repeat("0", 64),
		}
		d, err := renewalDigest(r.Preimage, renewal.AppendJSON(nil))
		if err != nil {
			return nil, fmt.Errorf("sim escrow run: %w", err)
		}
		renewal.Digest = d
		h.Renewals = append(h.Renewals, contracts.SignedRuntimeNetworkDnsLeaseRenewal{
			Authority: json.RawMessage(`{"id":"authority-sim","revision":1}`),
			Renewal:   renewal,
			Signature: json.RawMessage(fmt.Sprintf(`"sim-signature-%d"`, renewal.Sequence)),
		})
	}
	return h, nil
}

// RenewalReceipt is one applyRuntimeNetworkDnsLeaseRenewal a node received.
type RenewalReceipt struct {
	At       time.Time
	Sequence int64
	Status   string // accepted, replay, or the refusal the node answered with
}

// RenewalCounter counts the DNS lease renewals a simulated node admits; `relay-dev` reports the
// admitted ones as escrowReleased. A counter made by RecordRenewals also keeps a receipt of every
// renewal pushed to the node.
type RenewalCounter struct {
	admitted atomic.Int64 // renewals the node admitted as new

	mu       sync.Mutex
	receipts []RenewalReceipt // guarded by mu: every renewal pushed, when made by RecordRenewals
}

// CountRenewals makes n count the renewals it admits, still admitting each by the node's rules,
// and returns the counter.
func CountRenewals(n *Node) *RenewalCounter { return countRenewals(n, false) }

// RecordRenewals is CountRenewals that also keeps a receipt of every renewal pushed to n, for
// Receipts.
func RecordRenewals(n *Node) *RenewalCounter { return countRenewals(n, true) }

func countRenewals(n *Node, record bool) *RenewalCounter {
	c := &RenewalCounter{}
	n.Handle(contracts.MethodApplyRuntimeNetworkDnsLeaseRenewal, func(body json.RawMessage) (json.RawMessage, error) {
		at := time.Now()
		resp, err := n.admitRenewal(body)
		status := "refused"
		if err == nil {
			var answer struct {
				Status string `json:"status"`
			}
			_ = json.Unmarshal(resp, &answer)
			status = answer.Status
		}
		if status == contracts.ApplyStatusAccepted {
			c.admitted.Add(1)
		}
		if record {
			var w renewalWire
			_ = json.Unmarshal(body, &w)
			c.mu.Lock()
			c.receipts = append(c.receipts, RenewalReceipt{At: at, Sequence: w.Signed.Renewal.Sequence, Status: status})
			c.mu.Unlock()
		}
		return resp, err
	})
	return c
}

// Admitted is how many renewals the node admitted as new.
func (c *RenewalCounter) Admitted() int64 { return c.admitted.Load() }

// Receipts are every renewal pushed to the node, in arrival order; nil unless made by
// RecordRenewals.
func (c *RenewalCounter) Receipts() []RenewalReceipt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]RenewalReceipt(nil), c.receipts...)
}
