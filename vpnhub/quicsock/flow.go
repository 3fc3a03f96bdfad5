package quicsock

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// Window is how many datagram-carrying packets of one flow may be handed to quic-go and not
	// yet drained: below quic-go's 128-frame datagram queue by the 32 packets its connection
	// goroutine processes at a time.
	Window = 96
	// countedSize is the smallest packet counted as carrying a datagram: a keep-alive (48
	// bytes) is not, a TCP acknowledgement through the tunnel (about 90) is; an ACK-only QUIC
	// packet stays below it unless it acknowledges a dozen ranges.
	countedSize = 64
)

// stallLimit bounds how long the reader waits for one flow to drain before it hands over anyway
// and starts the flow's count again: a count that drifted (a large packet that carried no
// datagram) or a drain loop that stopped must not stop the socket for longer. Tests raise it.
var stallLimit = 10 * time.Millisecond

// Flow is the datagrams from one remote address that one drain loop takes out of quic-go.
type Flow struct {
	c        *flows
	addr     netip.AddrPort
	refs     int          // guarded by flows.mu
	inflight atomic.Int64 // counted packets handed to quic-go less datagrams drained, at least 0
}

// Drained tells the reader one datagram was taken out of quic-go. It never blocks.
func (f *Flow) Drained() {
	v := f.inflight.Add(-1)
	if v < 0 {
		f.inflight.CompareAndSwap(v, 0) // a packet carried several datagrams, or was not counted
	}
	if f.c.waitingOn.Load() == f && v < Window {
		select {
		case f.c.wake <- struct{}{}:
		default:
		}
	}
}

// Close ends the flow: its packets are handed over uncounted from then on.
func (f *Flow) Close() {
	f.c.mu.Lock()
	defer f.c.mu.Unlock()
	if f.refs--; f.refs == 0 && f.c.byAddr[f.addr] == f {
		delete(f.c.byAddr, f.addr)
	}
}

// flows are a socket's registered flows and the reader's wait for one of them.
type flows struct {
	mu        sync.Mutex
	byAddr    map[netip.AddrPort]*Flow // guarded by mu
	waitingOn atomic.Pointer[Flow]     // the flow the reader waits for, or nil
	wake      chan struct{}            // capacity 1: a flow the reader waits for drained
	timer     *time.Timer              // owned by the reader
}

func newFlows() *flows {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &flows{byAddr: make(map[netip.AddrPort]*Flow), wake: make(chan struct{}, 1), timer: t}
}

// flow registers the flow from addr, or takes another reference to it.
func (fs *flows) flow(addr netip.AddrPort) *Flow {
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.byAddr[addr]
	if f == nil {
		f = &Flow{c: fs, addr: addr}
		fs.byAddr[addr] = f
	}
	f.refs++
	return f
}

// lookup returns the flow from addr, or nil.
func (fs *flows) lookup(addr netip.AddrPort) *Flow {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.byAddr[addr]
}

// admit counts one packet of f handed to quic-go. When f's window is full it waits for f's
// drain, up to stallLimit, and reports false if it waited and mayWait was false (the caller has
// packets to hand over first).
func (fs *flows) admit(f *Flow, mayWait bool) bool {
	for f.inflight.Load() >= Window {
		if !mayWait {
			return false
		}
		fs.waitingOn.Store(f)
		if f.inflight.Load() >= Window { // drained between the check and the store: no wake-up comes
			fs.timer.Reset(stallLimit)
			select {
			case <-fs.wake:
			case <-fs.timer.C:
				f.inflight.Store(0)
			}
			fs.timer.Stop()
		}
		fs.waitingOn.Store(nil)
	}
	f.inflight.Add(1)
	return true
}
