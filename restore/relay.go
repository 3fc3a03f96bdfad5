package restore

import (
	"context"
	"encoding/json"
	"errors"

	"code.foss.global/serve.zone/relay/contracts"
)

// The restore as the relay sees it: relay.Feature (the five methods), relay.Observer (the
// Corestore origins in each configuration push) and relay.Component (Run, Ready). The relay finds
// these by their method sets; this package does not import it.

// Peer, Node and Upstream are the relay's aliases of the same names. The restore uses none of them.
type (
	Peer = interface {
		ID() uint64
		Call(method string, body json.RawMessage, done func(json.RawMessage, error))
	}
	Node = interface {
		ID() uint64
		Call(method string, body json.RawMessage, done func(json.RawMessage, error))
		Session() contracts.RuntimeSession
		Context() context.Context
	}
	Upstream = interface {
		Attached() bool
		Call(method string, body json.RawMessage, done func(json.RawMessage, error))
	}
)

// Methods: the five isolated-restore methods, from Cloudly only.
func (r *Restore) Methods() (fromCloudly, fromDownstream []string) {
	m := contracts.IsolatedRestoreMethods()
	return m[:], nil
}

// ServeCloudly serves one of the five (Serve).
func (r *Restore) ServeCloudly(method string, _ bool, body json.RawMessage, reply func(json.RawMessage, error)) {
	r.Serve(method, body, reply)
}

// ServeDownstream: the restore serves nothing to downstream peers.
func (r *Restore) ServeDownstream(method string, _ Peer, _ json.RawMessage, reply func(json.RawMessage, error)) {
	reply(nil, contracts.RelayMethodUnknown.Refuse("%s is not served to this connection", method))
}

// Configured replaces the Corestore origins with the push's.
func (r *Restore) Configured(cfg contracts.ClusterRelayConfig) { r.setCorestores(cfg.Corestores) }

// Attached, Detached, CustodyEnded, NodeBound and PeerGone change nothing: a restore control
// travels to a node's Corestore, never over the relay's connections.
func (r *Restore) Attached(Upstream) {}
func (r *Restore) Detached()         {}
func (r *Restore) CustodyEnded()     {}
func (r *Restore) NodeBound(Node)    {}
func (r *Restore) PeerGone(Peer)     {}

// Run serves until ctx ends, then closes the restore (Close) and returns.
func (r *Restore) Run(ctx context.Context) error {
	<-ctx.Done()
	return r.Close()
}

// Ready is an error once the restore is closed.
func (r *Restore) Ready() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("closed")
	}
	return nil
}
