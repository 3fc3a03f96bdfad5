// Package feature is the seam between the relay core and its optional parts (escrow, ingress,
// restore, vpnhub, platform): the ports a part is handed — Peer, Node, Upstream — and the small
// interfaces a part implements to serve methods, hear events, run beside the relay and report to
// the status page. A part implements only what it cares about; the relay finds out which, one
// interface at a time, when it is built, and never asks again.
//
// It imports only the standard library and contracts, so every part imports it and none imports
// the relay or another part; cmd/relay wires them together.
//
// Replies: every Reply is called exactly once, from any goroutine, and must not block. An error
// given to a Reply is sent to the caller as is: a *contracts.Refusal travels as
// "<name>: <reason>", a *contracts.ProtocolRefusal as the protocol refusal, and an error a Peer or
// Upstream call returned (the remote peer's own error) untouched.
package feature

import (
	"context"
	"encoding/json"

	"code.foss.global/serve.zone/relay/contracts"
)

// Reply answers one request: its body, or an error.
type Reply = func(body json.RawMessage, err error)

// Peer is one downstream connection.
//
//   - ID is unique per connection for the life of the process.
//   - Call sends a request to the peer, never blocking; done gets its answer body or an error:
//     the peer's own error, or a refusal (relay-node-busy when its send queue is full,
//     relay-node-not-carried when the connection is gone, relay-call-timeout).
type Peer interface {
	ID() uint64
	Call(method string, body json.RawMessage, done Reply)
}

// Node is a downstream connection bound to a node session. Session is the binding Cloudly
// answered the node's latest accepted registration with; Context ends when the connection does.
type Node interface {
	Peer
	Session() contracts.RuntimeSession
	Context() context.Context
}

// Upstream is the relay's Cloudly session.
//
//   - Attached reports whether the relay has an accepted registration with Cloudly now; a request
//     Cloudly sends right after accepting one already sees true.
//   - Call sends a request to Cloudly; done gets Cloudly's answer or error untouched, or a
//     refusal (relay-upstream-detached, relay-upstream-busy, relay-call-timeout).
type Upstream interface {
	Attached() bool
	Call(method string, body json.RawMessage, done Reply)
}

// Serving. A part lists what it serves once (Methods, read when the relay is built) and serves it
// on the caller's read loop: it must not block (start a goroutine for slow work, as restore
// does). The relay's method table (relay/methods.go) says what happens to a method no part
// serves.

// Server lists the methods a part serves: fromCloudly are methods Cloudly calls on the relay,
// fromDownstream methods a node or the ingress calls on it. A part that lists methods from a side
// implements that side's serving interface.
type Server interface {
	Methods() (fromCloudly, fromDownstream []string)
}

// CloudlyServer serves Cloudly's requests for the methods it lists.
type CloudlyServer interface {
	ServeCloudly(method string, body json.RawMessage, reply Reply)
}

// DownstreamServer serves a downstream peer's requests for the methods it lists.
type DownstreamServer interface {
	ServeDownstream(method string, p Peer, body json.RawMessage, reply Reply)
}

// Events. Each is short, never blocks, and is never called with a relay lock held.

// UpstreamUser is handed the relay's Cloudly session once, when the relay is built, before
// anything runs.
type UpstreamUser interface{ UseUpstream(up Upstream) }

// AttachWatcher hears that Cloudly accepted the relay's registration.
type AttachWatcher interface{ Attached(up Upstream) }

// DetachWatcher hears that the attached session was lost (or closed for shutdown).
type DetachWatcher interface{ Detached() }

// CustodyWatcher hears that Cloudly named an undispatched refusal (docs/protocol.md#refusals-that-end-custody) or pushed
// relay: null: it no longer dispatches to this relay.
type CustodyWatcher interface{ CustodyEnded() }

// ConfigWatcher hears Cloudly's relay configuration push (docs/protocol.md#relay-configuration-push); the newest replaces the
// rest.
type ConfigWatcher interface {
	Configured(cfg contracts.ClusterRelayConfig)
}

// NodeWatcher hears that a connection was bound, or bound again (a rotation), to a node session.
// The connection's end is n.Context()'s: a part that keeps n follows it (context.AfterFunc).
type NodeWatcher interface{ NodeBound(n Node) }

// PeerWatcher hears that a downstream connection ended, whatever it carried.
type PeerWatcher interface{ PeerGone(p Peer) }

// Running and reporting.

// Component is a part the relay runs beside itself. The relay starts Run and stops it (ends its
// ctx) after the downstream connections and the Cloudly session are closed; a Run that fails
// before then stops the relay with its error. Ready says why the part cannot serve now (nil: it
// can); /readyz reports it.
type Component interface {
	Run(ctx context.Context) error
	Ready() error
}

// Reporter is a part with facts for the operator's status page (/status, /status.json): Status
// returns a value encoding/json can marshal — counts, states, times, and at most 100 rows of any
// list — built from counters the part keeps anyway, cheap enough to build on every page load. It
// never holds a secret or a body: no bearer, JWT, grant, key, route table or request body.
type Reporter interface{ Status() any }

// Several relays per cluster (docs/ha.md) and detached re-binding (docs/escrow.md).

// LeadWatcher hears whether the relay leads: an HA standby, or a leader that lost its Lease,
// hears false and acts for the cluster no more (escrow releases nothing); a relay without HA
// leads from the start.
type LeadWatcher interface{ Leading(leading bool) }

// Rebinder keeps, for every node whose registration Cloudly accepted, a keyed digest of the exact
// body the relay forwarded and Cloudly's answer, so that a node registering again byte for byte
// while the relay is detached is answered and bound without Cloudly (docs/escrow.md). It never keeps a
// body: the relay digests one before forwarding it.
type Rebinder interface {
	RegistrationDigest(body json.RawMessage) [32]byte
	Accepted(node string, digest [32]byte, answer json.RawMessage)
	Rebind(digest [32]byte) (answer json.RawMessage, ok bool)
}

// ReplicaSync is the HA leader's word that its standbys have what the replicated parts sent
// (docs/ha.md): Sync calls done once every standby connected now with a complete copy has
// acknowledged everything sent so far — done(true) — or at once when none is, or once the bound
// passed — done(false). It never blocks; done is called exactly once, from any goroutine, and may
// run before Sync returns. A part handed one (cmd/relay does, before anything
// runs) answers what must survive a failover from done.
type ReplicaSync interface {
	Sync(done func(replicated bool))
}

// Replicated is a part an HA leader copies to its standbys, in memory only (docs/ha.md): records by
// key, a nil value removing one. Replicate sends every record held now, then every change, until
// stop; send runs with the part's lock held and must not block. A standby adopts the leader's
// records (Adopt), and forgets its copy before it copies another leader's (ForgetCopy).
type Replicated interface {
	Replicate(send func(key string, value []byte)) (stop func())
	Adopt(key string, value []byte) error
	ForgetCopy()
}

// Tenure is whether this relay still leads its cluster, judged at the instant of the question:
// for an HA relay, while its election term runs and its tenure — measured on the monotonic clock
// from the moment its last successful Lease renewal was sent — has not run out, which is never
// later than the Lease can expire for the other relays; without HA, always. Every path that acts
// for the cluster asks it right before acting — forwarding to Cloudly, releasing escrow, serving
// the VPN membership — so that a process stopped and resumed (SIGSTOP, a long pause, a frozen VM)
// acts on nothing before it has looked again. Held is an atomic load and a clock read; it never
// blocks.
type Tenure interface{ Held() bool }

// TenureUser is handed the relay's Tenure once, when the relay is built, before anything runs.
type TenureUser interface{ UseTenure(t Tenure) }
