package escrow

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// The escrow as an HA leader copies it to its standbys (docs/ha.md, feature.Replicated): in memory
// only, a record per key — the re-binding key, each node's run, each node's re-binding pair, and
// how far each node has acknowledged its run's renewals — sent whole when a standby connects and
// again whenever it changes; a nil value removes the key. A standby adopts the records as its own
// state, so that when it leads it holds every run and pair, pushes no renewal a node already
// acknowledged, and pushes again what it did not.
//
// Records, every key under ReplicationPrefix: "escrow/key" → the 32-byte re-binding key;
// "escrow/run/<node>" → the node's hold request, as JSON the hold reader takes (and judges again
// on the standby); "escrow/pair/<node>" → digest ‖ until (8 bytes, big-endian Unix ms) ‖
// Cloudly's answer; "escrow/ack/<node>" → the highest sequence the node acknowledged (8 bytes,
// big-endian) ‖ the run's projection reference as JSON, which it counts in.
const (
	// ReplicationPrefix begins every key the escrow replicates; ReplicatedRunPrefix the keys of
	// its runs.
	ReplicationPrefix   = "escrow/"
	ReplicatedRunPrefix = runPrefix

	keyRecord  = ReplicationPrefix + "key"
	runPrefix  = ReplicationPrefix + "run/"
	pairPrefix = ReplicationPrefix + "pair/"
	ackPrefix  = ReplicationPrefix + "ack/"
)

func runKey(node string) string  { return runPrefix + node }
func pairKey(node string) string { return pairPrefix + node }
func ackKey(node string) string  { return ackPrefix + node }

// Replicate sends every record the escrow holds now, then every change, until stop is called.
// send is called with the escrow's lock held, in the order of the changes: it must not block.
func (e *Escrow) Replicate(send func(key string, value []byte)) (stop func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	send(keyRecord, append([]byte(nil), e.pairs.key[:]...))
	for id, ns := range e.sched.nodes {
		if ns.run != nil {
			send(runKey(id), ns.run.appendHold(nil, id))
			if ns.acked >= 0 {
				send(ackKey(id), appendAckRecord(nil, ns.acked, ns.run.projection))
			}
		}
	}
	for id, p := range e.pairs.byNode {
		send(pairKey(id), p.appendRecord(nil))
	}
	w := &watcher{send: send}
	e.watchers = append(e.watchers, w)
	return func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		for i, x := range e.watchers {
			if x == w {
				e.watchers = append(e.watchers[:i], e.watchers[i+1:]...)
				return
			}
		}
	}
}

// watcher is one standby's copy being fed.
type watcher struct {
	send func(key string, value []byte)
}

// replicateLocked sends a change to every standby.
func (e *Escrow) replicateLocked(key string, value []byte) {
	for _, w := range e.watchers {
		w.send(key, value)
	}
}

// Adopt applies a record copied from the leader: a run is held whatever this relay carries (a
// standby carries nothing), a pair and the key are kept. A record that does not read is refused
// and changes nothing.
func (e *Escrow) Adopt(key string, value []byte) error {
	now := e.nowMs()
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case key == keyRecord:
		if len(value) != len(e.pairs.key) {
			return errors.New("escrow: replicated key of the wrong size")
		}
		copy(e.pairs.key[:], value)
	case strings.HasPrefix(key, runPrefix):
		node := key[len(runPrefix):]
		if value == nil {
			e.sched.clear(node)
			break
		}
		req, err := contracts.ReadHoldRuntimeNetworkDnsLeaseRenewalsRequest(value)
		if err != nil || req.NodeID != node || len(req.Renewals) == 0 || len(req.OrderReasons()) > 0 {
			return fmt.Errorf("escrow: replicated run of %s does not read", node)
		}
		if _, last := req.Span(); last <= now {
			return nil // ended on the way
		}
		e.sched.hold(node, newHeldRun(&req), now)
		e.changedLocked()
	case strings.HasPrefix(key, ackPrefix):
		node := key[len(ackPrefix):]
		if value == nil {
			break // an acknowledgement goes with its run
		}
		seq, projection, ok := readAckRecord(value)
		if !ok {
			return fmt.Errorf("escrow: replicated acknowledgement of %s does not read", node)
		}
		e.sched.acknowledged(node, projection, seq, now)
		e.changedLocked()
	case strings.HasPrefix(key, pairPrefix):
		node := key[len(pairPrefix):]
		if value == nil {
			e.dropPairLocked(node)
			break
		}
		p, ok := readPairRecord(value)
		if !ok || !contracts.IsClusterNodeID(node) {
			return fmt.Errorf("escrow: replicated pair of %s does not read", node)
		}
		e.setPairLocked(node, p)
	default:
		return fmt.Errorf("escrow: unknown replicated record %q", key)
	}
	e.gaugesLocked()
	return nil
}

// ForgetCopy drops every run and pair: a standby about to copy another leader's escrow starts
// from nothing.
func (e *Escrow) ForgetCopy() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, ns := range e.sched.nodes {
		if ns.run != nil {
			e.sched.clear(id)
		}
	}
	for node := range e.pairs.byNode {
		e.dropPairLocked(node)
	}
	e.gaugesLocked()
}

// appendHold appends the run as the hold request that would hold it again.
func (r *heldRun) appendHold(dst []byte, node string) []byte {
	dst = append(dst, `{"nodeId":`...)
	dst = strictjson.AppendString(dst, node)
	dst = append(dst, `,"projection":`...)
	dst = r.projection.AppendJSON(dst)
	dst = append(dst, `,"renewals":[`...)
	for i := range r.renewals {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, r.envelope(i)...)
	}
	return append(dst, "]}"...)
}

func (p rebindPair) appendRecord(dst []byte) []byte {
	dst = append(dst, p.digest[:]...)
	dst = binary.BigEndian.AppendUint64(dst, uint64(p.until))
	return append(dst, p.answer...)
}

func appendAckRecord(dst []byte, seq int64, projection contracts.ProjectionReference) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(seq))
	return projection.AppendJSON(dst)
}

func readAckRecord(b []byte) (int64, contracts.ProjectionReference, bool) {
	var p contracts.ProjectionReference
	if len(b) < 8 {
		return 0, p, false
	}
	seq := int64(binary.BigEndian.Uint64(b))
	if err := json.Unmarshal(b[8:], &p); err != nil || seq < 0 || string(p.AppendJSON(nil)) != string(b[8:]) {
		return 0, p, false
	}
	return seq, p, true
}

func readPairRecord(b []byte) (rebindPair, bool) {
	var p rebindPair
	if len(b) < 40 {
		return p, false
	}
	copy(p.digest[:], b)
	p.until = int64(binary.BigEndian.Uint64(b[32:40]))
	p.answer = append(json.RawMessage(nil), b[40:]...)
	return p, json.Valid(p.answer)
}
