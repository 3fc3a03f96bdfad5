package relay

import (
	"context"
	"sync"

	"github.com/coder/websocket"
)

// peerSet is every open downstream connection.
type peerSet struct {
	mu     sync.Mutex
	byID   map[uint64]*peer // guarded by mu
	closed bool             // guarded by mu: shutting down, no new peers
	wg     sync.WaitGroup
}

func (s *peerSet) add(p *peer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.byID[p.id] = p
	s.wg.Add(1)
	return true
}

func (s *peerSet) remove(p *peer) {
	s.mu.Lock()
	delete(s.byID, p.id)
	s.mu.Unlock()
	s.wg.Done()
}

func (s *peerSet) snapshot() []*peer {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*peer, 0, len(s.byID))
	for _, p := range s.byID {
		out = append(out, p)
	}
	return out
}

// closeAll stops new peers and closes every open one with 1001, waiting at most until ctx ends.
func (s *peerSet) closeAll(ctx context.Context) {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	for _, p := range s.snapshot() {
		go p.conn.Close(websocket.StatusGoingAway, "relay shutting down")
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		// The library's close handshake waits for the peer on its own timeouts, and CloseNow waits
		// for that handshake; closing the socket under it ends both at once.
		for _, p := range s.snapshot() {
			if p.raw != nil {
				p.raw.Close()
			}
			p.conn.CloseNow()
		}
		<-done
	}
}

// closeEach closes every open peer with code, and lets new ones in.
func (s *peerSet) closeEach(code websocket.StatusCode, reason string) {
	for _, p := range s.snapshot() {
		go p.conn.Close(code, reason)
	}
}

func (s *peerSet) queued() float64 {
	n := 0
	for _, p := range s.snapshot() {
		n += p.conn.QueueLen()
	}
	return float64(n)
}

// nodeTable maps node ids to the connection carrying them.
type nodeTable struct {
	mu   sync.Mutex
	byID map[string]*peer // guarded by mu
}

// bind makes p the carrier of id and returns the previous carrier, if any.
func (t *nodeTable) bind(id string, p *peer) *peer {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.byID[id]
	t.byID[id] = p
	return old
}

// unbind removes id if p still carries it.
func (t *nodeTable) unbind(id string, p *peer) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byID[id] != p {
		return false
	}
	delete(t.byID, id)
	return true
}

func (t *nodeTable) get(id string) *peer {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byID[id]
}
