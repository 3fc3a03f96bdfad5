package sim

import (
	"context"
	"encoding/json"
	"sync"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// IngressControl plays Cloudly's side of the cluster ingress on a sim Cloudly: it judges
// registerClusterIngress as Cloudly does (the offer, the shape, the designation, the node, the
// bearer), answers getClusterRouteTable with the table it holds, and pushes tables to the relay.
type IngressControl struct {
	c *Cloudly

	mu         sync.Mutex
	designated map[string]string // guarded by mu: node → the bearer it accepts there
	table      json.RawMessage   // guarded by mu: what getClusterRouteTable answers; null at first
	outcomes   map[string]int    // guarded by mu: registrations by outcome
}

// ServeIngress installs Cloudly's ingress handlers on c and returns their control.
func ServeIngress(c *Cloudly) *IngressControl {
	ic := &IngressControl{c: c, designated: make(map[string]string), table: json.RawMessage("null"),
		outcomes: make(map[string]int)}
	c.Handle(contracts.MethodRegisterClusterIngress, ic.register)
	c.Handle(contracts.MethodGetClusterRouteTable, ic.routeTable)
	return ic
}

// Designate lets an ingress on node register with bearer.
func (ic *IngressControl) Designate(node, bearer string) {
	ic.mu.Lock()
	ic.designated[node] = bearer
	ic.mu.Unlock()
}

// SetTable sets the table getClusterRouteTable answers from now on, without pushing it.
func (ic *IngressControl) SetTable(table json.RawMessage) {
	ic.mu.Lock()
	ic.table = append(json.RawMessage(nil), table...)
	ic.mu.Unlock()
}

// PushTable sets the table and pushes it to the relay: pushClusterRouteTable { table }. It returns
// the relay's answer { appliedRevision }.
func (ic *IngressControl) PushTable(ctx context.Context, table json.RawMessage) (json.RawMessage, error) {
	ic.SetTable(table)
	body := make([]byte, 0, len(table)+10)
	body = append(append(append(body, `{"table":`...), table...), '}')
	return ic.c.Call(ctx, contracts.MethodPushClusterRouteTable, body)
}

// Registrations is how many ingress registrations ended with outcome: "accepted", a refusal
// reason, or "protocol-incompatible".
func (ic *IngressControl) Registrations(outcome string) int {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return ic.outcomes[outcome]
}

func (ic *IngressControl) register(body json.RawMessage) (json.RawMessage, error) {
	resp, outcome, err := ic.judge(body)
	ic.mu.Lock()
	ic.outcomes[outcome]++
	ic.mu.Unlock()
	return resp, err
}

// judge is Cloudly's order: the offer first, then the shape, then designation, node and bearer.
func (ic *IngressControl) judge(body json.RawMessage) (json.RawMessage, string, error) {
	offer, err := contracts.ReadProtocolOffer(body)
	if err != nil {
		return ic.refuse("registration-invalid")
	}
	if r, _ := contracts.NegotiateProtocol(ic.c.Offer, offer); r != nil {
		return nil, contracts.ProtocolIncompatibleCode, r
	}
	reg, err := contracts.ReadClusterIngressRegistration(body)
	if err != nil {
		return ic.refuse("registration-invalid")
	}
	ic.mu.Lock()
	bearer, designated := ic.designated[reg.NodeID]
	anyDesignated := len(ic.designated) > 0
	table := ic.table
	ic.mu.Unlock()
	switch {
	case !anyDesignated:
		return ic.refuse("ingress-not-designated")
	case !designated:
		return ic.refuse("node-mismatch")
	case reg.Bearer.Reveal() != bearer:
		return ic.refuse("bearer-refused")
	}
	revision := json.RawMessage("null")
	if t, err := contracts.ReadRouteTable(table, "table"); err == nil && !t.IsNull() {
		revision, _ = json.Marshal(t.Revision)
	}
	o, _ := ic.c.Offer.MarshalJSON()
	resp := append([]byte(`{"accepted":true,"revision":`), revision...)
	resp = append(append(append(resp, `,"protocol":`...), o...), '}')
	return resp, "accepted", nil
}

// refusalRetryAfterMs is the retryAfterMs of every refusal.
const refusalRetryAfterMs = 5_000

// refuse answers IClusterIngressRegistrationRefusal in the error's data. It never quotes the bearer.
func (ic *IngressControl) refuse(reason string) (json.RawMessage, string, error) {
	r := contracts.ClusterIngressRegistrationRefusal{Code: contracts.ClusterIngressRegistrationRefusedCode, Reason: reason, RetryAfterMs: refusalRetryAfterMs}
	return nil, reason, &typedsocket.Error{Text: r.Text(), Data: r.Data()}
}

func (ic *IngressControl) routeTable(body json.RawMessage) (json.RawMessage, error) {
	if strictjson.ReadExact(body) != nil {
		return nil, contracts.RelayRequestInvalid.Refuse("getClusterRouteTable takes {}")
	}
	ic.mu.Lock()
	table := ic.table
	ic.mu.Unlock()
	out := make([]byte, 0, len(table)+10)
	return append(append(append(out, `{"table":`...), table...), '}'), nil
}
