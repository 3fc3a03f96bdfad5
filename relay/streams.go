package relay

import (
	"context"
	"sync"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// Stream bindings (docs/protocol.md#streams). A body that crosses the relay holding a stream marker binds that
// streamId to the node connection it came from or went to; every ##VirtualStream## frame is then
// routed by its streamId alone: from the bound node up to Cloudly, from Cloudly down to the bound
// node, whole and untouched.
const (
	maxStreamsPerPeer = 64
	maxStreams        = 4096
	streamIdle        = 60 * time.Second // a binding ends after this long without a frame
	// streamLinger (project-defined) is how long a binding lives on after its closing chunk has
	// crossed: the chunk's own answer and the writer's last keep-alive (the library sends one a
	// second, and learns from its answer that the stream ended) still cross after it.
	streamLinger = 10 * time.Second
	// streamGoneFor is how long Cloudly's frames for a stream whose node left are answered
	// relay-stream-gone rather than relay-stream-unknown.
	streamGoneFor = 60 * time.Second
	// streamSweepInterval is how often ended bindings are collected.
	streamSweepInterval = 5 * time.Second
)

// streamTable is every bound stream. It does no I/O and reads no clock: every input carries now,
// and the relay sweeps it on a ticker. Guarded by mu; its methods are safe from any goroutine.
type streamTable struct {
	mu     sync.Mutex
	byID   map[string]*streamBinding     // guarded by mu
	byPeer map[*peer]map[string]struct{} // guarded by mu: each connection's streams
	gone   map[string]time.Time          // guarded by mu: streams whose node left, until when
}

type streamBinding struct {
	p     *peer
	last  time.Time // the last frame, either way
	until time.Time // zero until the closing chunk crossed; then when the binding ends
	// calls are the requests whose bodies carried the stream: each frame gives them another
	// call timeout, so a request whose answer waits on its stream lives as long as it moves.
	calls []typedsocket.Pending
}

// maxCallsPerStream bounds the requests a binding keeps alive (one, in the library's use).
const maxCallsPerStream = 4

func newStreamTable() *streamTable {
	return &streamTable{byID: make(map[string]*streamBinding), byPeer: make(map[*peer]map[string]struct{}),
		gone: make(map[string]time.Time)}
}

// bind binds ids to p, all or none: a stream already bound to another connection is not taken
// over (relay-stream-unknown), and beyond maxStreamsPerPeer or maxStreams the body carrying the
// markers is refused (relay-node-busy). A stream already bound to p is only touched.
func (t *streamTable) bind(ids []string, p *peer, now time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	mine := t.byPeer[p]
	fresh := 0
	for _, id := range ids {
		switch b := t.byID[id]; {
		case b == nil:
			fresh++
		case b.p != p:
			return contracts.RelayStreamUnknown.Refuse("stream %s is bound to another connection", id)
		}
	}
	if len(mine)+fresh > maxStreamsPerPeer {
		return contracts.RelayNodeBusy.Refuse("%d streams are open on this connection already", len(mine))
	}
	if len(t.byID)+fresh > maxStreams {
		return contracts.RelayNodeBusy.Refuse("the relay carries %d streams already", len(t.byID))
	}
	for _, id := range ids {
		if b := t.byID[id]; b != nil {
			b.last = now
			continue
		}
		if mine == nil {
			mine = make(map[string]struct{})
			t.byPeer[p] = mine
		}
		mine[id] = struct{}{}
		t.byID[id] = &streamBinding{p: p, last: now}
		delete(t.gone, id)
	}
	return nil
}

// keepAlive makes every frame of the streams ids give k another call timeout.
func (t *streamTable) keepAlive(ids []string, k typedsocket.Pending) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		if b := t.byID[id]; b != nil && len(b.calls) < maxCallsPerStream {
			b.calls = append(b.calls, k)
		}
	}
}

// route finds where a stream frame goes. from is the node connection it came from, nil for
// Cloudly: a node's frame goes up (the returned peer is nil) only for a stream bound to it, and
// Cloudly's frame goes down to the stream's node. closing marks the frame that carries the
// closing chunk: the binding then ends streamLinger later. Every request that carried the
// stream gets another call timeout.
func (t *streamTable) route(id string, from *peer, closing bool, now time.Time) (*peer, error) {
	t.mu.Lock()
	b := t.byID[id]
	var calls []typedsocket.Pending
	if b != nil {
		calls = b.calls
	}
	t.mu.Unlock()
	for _, k := range calls {
		k.Extend()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if b == nil || from != nil && b.p != from {
		if _, gone := t.gone[id]; gone && from == nil {
			return nil, contracts.RelayStreamGone.Refuse("stream %s: its node connection has ended", id)
		}
		return nil, contracts.RelayStreamUnknown.Refuse("stream %s is not bound here", id)
	}
	b.last = now
	if closing && b.until.IsZero() {
		b.until = now.Add(streamLinger)
	}
	if from != nil {
		return nil, nil
	}
	return b.p, nil
}

// peerGone ends every stream of p; Cloudly's further frames for them are answered
// relay-stream-gone for streamGoneFor.
func (t *streamTable) peerGone(p *peer, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id := range t.byPeer[p] {
		delete(t.byID, id)
		if len(t.gone) < maxStreams {
			t.gone[id] = now.Add(streamGoneFor)
		}
	}
	delete(t.byPeer, p)
}

// sweep ends the bindings idle for streamIdle or past their linger, and forgets departed streams
// after streamGoneFor. It returns how many bindings it ended.
func (t *streamTable) sweep(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	ended := 0
	for id, b := range t.byID {
		if now.Sub(b.last) >= streamIdle || !b.until.IsZero() && !now.Before(b.until) {
			t.unbindLocked(id, b.p)
			ended++
		}
	}
	for id, until := range t.gone {
		if !now.Before(until) {
			delete(t.gone, id)
		}
	}
	return ended
}

func (t *streamTable) unbindLocked(id string, p *peer) {
	delete(t.byID, id)
	if mine := t.byPeer[p]; mine != nil {
		delete(mine, id)
		if len(mine) == 0 {
			delete(t.byPeer, p)
		}
	}
}

// len is the number of bound streams.
func (t *streamTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID)
}

// bindMarkers binds every stream marker in body to p and returns the streams. A byte search comes
// first, so a body without a marker costs one scan and no parse.
func (r *Relay) bindMarkers(p *peer, body []byte) ([]string, error) {
	if !contracts.HasStreamMarker(body) {
		return nil, nil
	}
	var ids []string
	if err := contracts.FindStreamMarkers(body, func(id string) error { ids = append(ids, id); return nil }); err != nil || len(ids) == 0 {
		return nil, nil // a body the receiver cannot parse carries no stream for it either
	}
	return ids, r.streams.bind(ids, p, r.now())
}

// serveNodeStream forwards a node's stream frame up to Cloudly, for a stream bound to that node,
// charged to the node's share until written. The frame goes whole, except for a relayNodeId the
// node put in it: a node cannot name a node to Cloudly (the binding is the authority).
func (r *Relay) serveNodeStream(p *peer, f *typedsocket.StreamFrame) {
	_, err := r.streams.route(f.StreamID, p, f.Closing, r.now())
	if err == nil {
		frame := f.Frame
		if f.RelayNodeID {
			frame = typedsocket.WithoutRelayNodeID(frame)
		}
		err = r.up.sendFrame(p.share, frame)
	}
	if err != nil {
		r.refuseStream(p.conn, f, err)
		return
	}
	r.metrics.streamFrames.WithLabelValues("to-cloudly").Inc()
}

// serveCloudlyStream forwards Cloudly's stream frame down to the stream's node, or hands it to the
// part holding the stream when the relay itself is its other end (localstreams.go).
func (r *Relay) serveCloudlyStream(c *typedsocket.Conn, f *typedsocket.StreamFrame) {
	if r.up.local.deliver(c, f) {
		return // the part counts its own frames
	}
	p, err := r.streams.route(f.StreamID, nil, f.Closing, r.now())
	if err == nil {
		if err = p.conn.SendFrame(f.Frame); err != nil {
			err = p.callError(err, contracts.MethodVirtualStream)
		}
	}
	if err != nil {
		r.refuseStream(c, f, err)
		return
	}
	r.metrics.streamFrames.WithLabelValues("to-node").Inc()
}

// refuseStream answers a stream frame the relay cannot route by name, or drops it (counted) when
// it carries no correlation id to answer.
func (r *Relay) refuseStream(c *typedsocket.Conn, f *typedsocket.StreamFrame, err error) {
	r.metrics.refused(err)
	c.RefuseStream(f, err)
}

// sweepStreams ends idle and closed stream bindings until ctx ends.
func (r *Relay) sweepStreams(ctx context.Context) {
	t := time.NewTicker(streamSweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.streams.sweep(r.now())
		}
	}
}
