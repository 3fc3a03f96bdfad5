package escrow

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"

	"code.foss.global/serve.zone/relay/contracts"
)

// Detached re-binding (docs/escrow.md, project-defined): for each node whose registration Cloudly
// accepted, the escrow keeps a keyed digest of the exact registration body the relay forwarded
// and the answer Cloudly gave, so that a node whose socket drops during an outage can register
// again byte for byte, be answered with that answer and bound to its session, and receive its
// renewals. Never kept: the body, the bearer inside it. The digest is HMAC-SHA-256 under a key
// that never leaves memory — made at New, or the HA leader's, copied to its standbys (replica.go).
// A pair lives as long as the node's escrow: every accepted hold extends it to that run's last
// expiresAt, so a node registered days before an outage re-binds like one registered a minute
// before; with no run held it lives the escrow horizon from its acceptance. It is dropped when the
// node's run is dropped (cleared, ended, custody ended, another scope), when a newer accepted
// registration of the node replaces it, and when its time has passed.

// pairSweepEvery is how often Run drops the pairs past the horizon (Unix ms); Rebind never
// answers with one in between.
const pairSweepEvery = 60_000

// rebindPair is one node's kept registration.
type rebindPair struct {
	digest [32]byte
	answer json.RawMessage // Cloudly's answer, { session, protocol }: no secret
	until  int64           // Unix ms: the later of the horizon after the acceptance and the node's run's end
}

// rebinds are every node's pairs. Guarded by Escrow.mu.
type rebinds struct {
	key      [32]byte
	byNode   map[string]rebindPair
	byDigest map[[32]byte]string
}

func newRebinds() rebinds {
	r := rebinds{byNode: make(map[string]rebindPair), byDigest: make(map[[32]byte]string)}
	rand.Read(r.key[:])
	return r
}

// RegistrationDigest is the keyed digest of a registration body, before it is forwarded.
func (e *Escrow) RegistrationDigest(body json.RawMessage) [32]byte {
	e.mu.Lock()
	key := e.pairs.key
	e.mu.Unlock()
	m := hmac.New(sha256.New, key[:])
	m.Write(body)
	var d [32]byte
	m.Sum(d[:0])
	return d
}

// Accepted keeps node's registration: its digest and Cloudly's answer, replacing the node's
// earlier pair.
func (e *Escrow) Accepted(node string, digest [32]byte, answer json.RawMessage) {
	if !contracts.IsClusterNodeID(node) {
		return
	}
	p := rebindPair{digest: digest, answer: append(json.RawMessage(nil), answer...), until: e.nowMs() + contracts.MaximumEscrowHorizonMs}
	e.mu.Lock()
	defer e.mu.Unlock()
	if ns := e.sched.nodes[node]; ns != nil && ns.run != nil {
		p.until = max(p.until, ns.run.lastExpires())
	}
	e.setPairLocked(node, p)
}

// extendPairLocked keeps node's pair at least until until (a run held for it ends then), and
// tells the standbys.
func (e *Escrow) extendPairLocked(node string, until int64) {
	p, ok := e.pairs.byNode[node]
	if !ok || p.until >= until {
		return
	}
	p.until = until
	e.pairs.byNode[node] = p
	e.replicateLocked(pairKey(node), p.appendRecord(nil))
}

// Rebind is the answer Cloudly gave the registration whose digest this is, while it is kept.
func (e *Escrow) Rebind(digest [32]byte) (json.RawMessage, bool) {
	now := e.nowMs()
	e.mu.Lock()
	defer e.mu.Unlock()
	node, ok := e.pairs.byDigest[digest]
	if !ok {
		return nil, false
	}
	p := e.pairs.byNode[node]
	if now >= p.until {
		e.dropPairLocked(node)
		return nil, false
	}
	return p.answer, true
}

func (e *Escrow) setPairLocked(node string, p rebindPair) {
	e.dropPairLocked(node)
	e.pairs.byNode[node] = p
	e.pairs.byDigest[p.digest] = node
	e.replicateLocked(pairKey(node), p.appendRecord(nil))
}

func (e *Escrow) dropPairLocked(node string) {
	p, ok := e.pairs.byNode[node]
	if !ok {
		return
	}
	delete(e.pairs.byNode, node)
	if e.pairs.byDigest[p.digest] == node {
		delete(e.pairs.byDigest, p.digest)
	}
	e.replicateLocked(pairKey(node), nil)
}

// expirePairsLocked drops the pairs past the horizon.
func (e *Escrow) expirePairsLocked(now int64) {
	for node, p := range e.pairs.byNode {
		if now >= p.until {
			e.dropPairLocked(node)
		}
	}
}
