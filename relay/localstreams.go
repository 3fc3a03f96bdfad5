package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"sync"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/internal/budget"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// Streams the relay itself is one end of (package feature's Streams and Memory, implemented by
// the upstream): a part opens or accepts a VirtualStream on the attached Cloudly socket, and
// Cloudly's frames for it reach the part instead of a node. serveCloudlyStream asks this table
// first; a stream here is never bound to a node (a node's body naming one of these ids is refused
// by the node table's own rules: the id was never bound to it).

// maxLocalStreams bounds the streams parts hold at once (project-defined): the platform agent's
// closures are a few.
const maxLocalStreams = 256

var (
	_ feature.Streams = (*upstream)(nil)
	_ feature.Memory  = (*upstream)(nil)
)

// localStreams is every stream parts hold. Guarded by mu; safe from any goroutine.
type localStreams struct {
	budget *budget.Budget // set at construction: the peer memory budget shares come from

	mu   sync.Mutex
	byID map[string]*localStream // guarded by mu
}

func newLocalStreams(b *budget.Budget) *localStreams {
	return &localStreams{budget: b, byID: make(map[string]*localStream)}
}

// localStream is one stream a part holds, on the socket it was opened on.
type localStream struct {
	t      *localStreams        // set at construction
	u      *upstream            // set at construction
	id     string               // set at construction
	conn   *typedsocket.Conn    // set at construction: the socket the stream lives on
	share  typedsocket.Share    // set at construction: charged for its frames until written
	reader feature.StreamReader // set at construction
	done   chan struct{}        // closed by end
	once   sync.Once
	stop   func() bool // set at construction: stops the socket watch

	mu    sync.Mutex
	calls []typedsocket.Pending // guarded by mu: calls whose bodies carry the stream
}

// NewShare opens a share of the peer memory budget that is never evicted (feature.Memory).
func (u *upstream) NewShare(limit int64) feature.Share {
	return u.local.budget.NewShare(limit, nil, nil)
}

// OpenStream opens a stream under a fresh id on the attached socket (feature.Streams).
func (u *upstream) OpenStream(share feature.Share, r feature.StreamReader) (feature.Stream, error) {
	var b [16]byte
	rand.Read(b[:])
	return u.local.add(u, "relay-"+hex.EncodeToString(b[:]), share, r)
}

// AcceptStream takes a stream id Cloudly named (feature.Streams).
func (u *upstream) AcceptStream(id string, share feature.Share, r feature.StreamReader) (feature.Stream, error) {
	if id == "" || len(id) > contracts.MaxStreamIDLen {
		return nil, contracts.RelayRequestInvalid.Refuse("a stream id of %d bytes", len(id))
	}
	return u.local.add(u, id, share, r)
}

func (t *localStreams) add(u *upstream, id string, share feature.Share, r feature.StreamReader) (*localStream, error) {
	conn := u.attached()
	if conn == nil {
		return nil, contracts.RelayUpstreamDetached.Refuse("the relay has no Cloudly session")
	}
	ts, ok := share.(typedsocket.Share)
	if !ok {
		return nil, contracts.RelayRequestInvalid.Refuse("a stream's share must come from this relay's NewShare")
	}
	s := &localStream{t: t, u: u, id: id, conn: conn, share: ts, reader: r, done: make(chan struct{})}
	t.mu.Lock()
	switch {
	case t.byID[id] != nil:
		t.mu.Unlock()
		return nil, contracts.RelayStreamUnknown.Refuse("stream %s is held already", id)
	case len(t.byID) >= maxLocalStreams:
		t.mu.Unlock()
		return nil, contracts.RelayNodeBusy.Refuse("the relay holds %d streams of its own already", len(t.byID))
	}
	t.byID[id] = s
	t.mu.Unlock()
	s.stop = context.AfterFunc(conn.Context(), s.end)
	return s, nil
}

// deliver hands Cloudly's frame to the part holding its stream, and reports whether one does.
// It runs on the socket's read loop.
func (t *localStreams) deliver(conn *typedsocket.Conn, f *typedsocket.StreamFrame) bool {
	t.mu.Lock()
	s := t.byID[f.StreamID]
	t.mu.Unlock()
	if s == nil || s.conn != conn {
		return false
	}
	s.extend()
	s.reader.StreamFrame(f.Frame)
	return true
}

func (t *localStreams) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID)
}

func (s *localStream) ID() string { return s.id }

func (s *localStream) Done() <-chan struct{} { return s.done }

// Send queues frame to Cloudly on the stream's socket, charged to its share until written.
func (s *localStream) Send(frame []byte) error {
	select {
	case <-s.done:
		return contracts.RelayUpstreamDetached.Refuse("stream %s has ended", s.id)
	default:
	}
	s.extend()
	return upstreamError(s.conn.SendFrame(frame, typedsocket.Charge(s.share)), contracts.MethodVirtualStream)
}

// Call sends a request carrying the stream on its socket; each frame extends it.
func (s *localStream) Call(method string, body json.RawMessage, done feature.Reply) {
	if s.u.attached() != s.conn {
		done(nil, contracts.RelayUpstreamDetached.Refuse("the Cloudly session the stream was opened on is gone"))
		return
	}
	k, err := s.conn.CallAsync(method, body, func(rep typedsocket.Reply) { done(rep.Response, upstreamError(rep.Err, method)) }, typedsocket.Charge(s.share))
	if err != nil {
		done(nil, upstreamError(err, method))
		return
	}
	s.mu.Lock()
	if len(s.calls) < maxCallsPerStream {
		s.calls = append(s.calls, k)
	}
	s.mu.Unlock()
}

func (s *localStream) extend() {
	s.mu.Lock()
	calls := s.calls
	s.mu.Unlock()
	for _, k := range calls {
		k.Extend()
	}
}

func (s *localStream) Close() {
	if s.stop != nil {
		s.stop()
	}
	s.end()
}

// end forgets the stream and closes done, once.
func (s *localStream) end() {
	s.once.Do(func() {
		s.t.mu.Lock()
		if s.t.byID[s.id] == s {
			delete(s.t.byID, s.id)
		}
		s.t.mu.Unlock()
		close(s.done)
	})
}
