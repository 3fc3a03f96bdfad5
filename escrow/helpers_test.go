package escrow

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

const (
	minute = int64(time.Minute / time.Millisecond)
	// slot0 is the first slot of the test runs: 2025-11-29T12:00:00Z, on a ten-minute grid.
	slot0 = int64(1_764_417_600_000)
)

var (
	cloudlyA = json.RawMessage(`{"kind":"cloudly","id":"cloudly-a"}`)
	cloudlyB = json.RawMessage(`{"kind":"cloudly","id":"cloudly-b"}`)
)

// runSpec describes a test run: n renewals for node, windows window ms long, one every step ms
// from start, sequences from 1.
type runSpec struct {
	node       string
	controller json.RawMessage
	namespace  string
	n          int
	start      int64
	step       int64
	window     int64
	edit       func(i int, r *contracts.RuntimeNetworkDnsLeaseRenewal) // before sealing
}

// the intended grid: fifteen-minute windows every ten minutes.
func gridRun(node string, n int, start int64) runSpec {
	return runSpec{node: node, n: n, start: start, step: 10 * minute, window: 15 * minute}
}

func projectionOf(node string) contracts.ProjectionReference {
	return contracts.ProjectionReference{ID: "projection-" + strings.TrimLeft(node, "-_"), Generation: 4, Digest: "sha256:" + strings.Repeat("7c", 32)}
}

func (s runSpec) request(t testing.TB) *contracts.HoldRuntimeNetworkDnsLeaseRenewalsRequest {
	t.Helper()
	if s.controller == nil {
		s.controller = cloudlyA
	}
	if s.namespace == "" {
		s.namespace = "rt-cluster-a"
	}
	h := &contracts.HoldRuntimeNetworkDnsLeaseRenewalsRequest{NodeID: s.node, Projection: projectionOf(s.node)}
	for i := range s.n {
		slot := s.start + int64(i)*s.step
		r := contracts.RuntimeNetworkDnsLeaseRenewal{
			Controller: s.controller, NodeID: s.node, RuntimeNamespace: s.namespace, Projection: h.Projection,
			Sequence: int64(i + 1), Dns: contracts.DnsWindow{IssuedAt: slot, NotBefore: slot, ExpiresAt: slot + s.window},
		}
		if s.edit != nil {
			s.edit(i, &r)
		}
		r, err := contracts.SealRuntimeNetworkDnsLeaseRenewal(r)
		if err != nil {
			t.Fatal(err)
		}
		h.Renewals = append(h.Renewals, contracts.SignedRuntimeNetworkDnsLeaseRenewal{
			Authority: json.RawMessage(`{"id":"authority-a","revision":2}`), Renewal: r,
			Signature: json.RawMessage(fmt.Sprintf(`"sig-%s-%d"`, s.node, i+1)),
		})
	}
	return h
}

func (s runSpec) body(t testing.TB) json.RawMessage { return s.request(t).AppendJSON(nil) }

// read is the request as the relay reads it: every envelope's Raw set.
func (s runSpec) read(t testing.TB) *contracts.HoldRuntimeNetworkDnsLeaseRenewalsRequest {
	t.Helper()
	h, err := contracts.ReadHoldRuntimeNetworkDnsLeaseRenewalsRequest(s.body(t))
	if err != nil {
		t.Fatal(err)
	}
	return &h
}

// held is the compact run of a valid spec.
func (s runSpec) held(t testing.TB) *heldRun { return newHeldRun(s.read(t)) }

// fakeNode is a node connection: it records every call and answers as the answer func says
// (nil: admit it, answering { status: accepted, renewal } for the renewal sent).
type fakeNode struct {
	id      uint64
	session contracts.RuntimeSession
	ctx     context.Context    // ends with end(): the connection's end
	end     context.CancelFunc // ends the connection

	mu     sync.Mutex
	calls  []fakeCall
	answer func(body json.RawMessage) (json.RawMessage, error)
	hold   bool // keep answers back until release()
	held   []func()
}

type fakeCall struct {
	method string
	body   json.RawMessage
	seq    int64
	at     time.Time
}

var fakeConnIDs struct {
	sync.Mutex
	next uint64
}

func newFakeNode(node string, controller json.RawMessage, namespace string, epoch int) *fakeNode {
	fakeConnIDs.Lock()
	fakeConnIDs.next++
	id := fakeConnIDs.next
	fakeConnIDs.Unlock()
	raw := json.RawMessage(fmt.Sprintf(`{"controller":%s,"clusterId":"cluster-a","nodeId":%q,"runtimeNamespace":%q,"epoch":%d}`,
		controller, node, namespace, epoch))
	ctx, end := context.WithCancel(context.Background())
	return &fakeNode{id: id, session: contracts.RuntimeSession{NodeID: node, Controller: controller, RuntimeNamespace: namespace, Raw: raw},
		ctx: ctx, end: end}
}

func (n *fakeNode) ID() uint64                        { return n.id }
func (n *fakeNode) Session() contracts.RuntimeSession { return n.session }
func (n *fakeNode) Context() context.Context          { return n.ctx }

func (n *fakeNode) Call(method string, body json.RawMessage, done func(json.RawMessage, error)) {
	seq := signedSequence(body)
	n.mu.Lock()
	n.calls = append(n.calls, fakeCall{method, append(json.RawMessage(nil), body...), seq, time.Now()})
	answer, hold := n.answer, n.hold
	n.mu.Unlock()
	if answer == nil {
		answer = admit
	}
	reply := func() { done(answer(body)) }
	if hold {
		n.mu.Lock()
		n.held = append(n.held, reply)
		n.mu.Unlock()
		return
	}
	reply()
}

// release sends the answers kept back.
func (n *fakeNode) release() {
	n.mu.Lock()
	held := n.held
	n.held, n.hold = nil, false
	n.mu.Unlock()
	for _, f := range held {
		f()
	}
}

func (n *fakeNode) setAnswer(f func(json.RawMessage) (json.RawMessage, error)) {
	n.mu.Lock()
	n.answer = f
	n.mu.Unlock()
}

func (n *fakeNode) received() []fakeCall {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]fakeCall(nil), n.calls...)
}

func (n *fakeNode) sequences() []int64 {
	var out []int64
	for _, c := range n.received() {
		out = append(out, c.seq)
	}
	return out
}

// admit answers { status: accepted, renewal } for the renewal in an apply request.
func admit(body json.RawMessage) (json.RawMessage, error) {
	signed, _, _ := strictjson.Lookup(body, "signed")
	renewal, _, _ := strictjson.Lookup(signed, "renewal")
	projection, _, _ := strictjson.Lookup(renewal, "projection")
	sequence, _, _ := strictjson.Lookup(renewal, "sequence")
	digest, _, _ := strictjson.Lookup(renewal, "digest")
	out := []byte(`{"status":"accepted","renewal":{"projection":`)
	out = append(out, projection...)
	out = append(out, `,"sequence":`...)
	out = append(out, sequence...)
	out = append(out, `,"digest":`...)
	out = append(out, digest...)
	return append(out, "}}"...), nil
}

func signedSequence(body json.RawMessage) int64 {
	signed, _, _ := strictjson.Lookup(body, "signed")
	renewal, _, _ := strictjson.Lookup(signed, "renewal")
	seq, _, _ := strictjson.Lookup(renewal, "sequence")
	n, _ := strictjson.ReadCounter(seq)
	return n
}

// clock is a settable fake clock.
type clock struct {
	mu  sync.Mutex
	now int64 // Unix ms
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.UnixMilli(c.now)
}

func (c *clock) set(ms int64) {
	c.mu.Lock()
	c.now = ms
	c.mu.Unlock()
}

func (c *clock) advance(ms int64) {
	c.mu.Lock()
	c.now += ms
	c.mu.Unlock()
}
