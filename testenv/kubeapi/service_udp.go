package kubeapi

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The Service's UDP port (WithUDP), as kube-proxy carries UDP to a Service's endpoints — the VPN
// hub's QUIC, here. Each client address is one flow, a conntrack entry: its datagrams all go to
// the endpoint chosen when the flow began, through a socket of the flow's own, and the
// endpoint's replies come back to the client from the Service's port. When that endpoint leaves
// the selection (its Pod relabelled, or deleted) kube-proxy deletes the UDP conntrack entries
// toward it, so the flow's next datagram is a new entry and goes to an endpoint selected now:
// after a failover, to the new leader, while the client keeps its address and port. A reply from
// an endpoint that is not the flow's own is dropped (with its entry gone nothing would
// translate it back). A datagram with no endpoint selected is dropped, as kube-proxy rejects
// it. A flow idle for udpFlowIdle is forgotten (conntrack's UDP timeout), and at most
// maxUDPFlows live at once.

// Bounds of the UDP port.
const (
	udpFlowIdle  = 120 * time.Second
	maxUDPFlows  = 4096
	maxDatagram  = 65535
	sweepEvery   = 10 * time.Second
	udpLoopback4 = "127.0.0.1:0"
)

// udpPort is the Service's UDP port.
type udpPort struct {
	s    *Service                                 // set at construction
	pc   *net.UDPConn                             // set at construction: the Service's port
	addr func(*corev1.Pod) (netip.AddrPort, bool) // set at construction: a selected Pod's UDP address
	wg   sync.WaitGroup                           // the flows' reply loops

	mu      sync.Mutex
	flows   map[netip.AddrPort]*udpFlow // guarded by mu: by client address
	closed  bool                        // guarded by mu
	dropped int                         // guarded by mu: datagrams no endpoint took
}

// udpFlow is one client's conntrack entry.
type udpFlow struct {
	client netip.AddrPort // set at construction
	up     *net.UDPConn   // set at construction: the flow's socket toward its endpoint

	mu     sync.Mutex
	target netip.AddrPort // guarded by mu: the flow's endpoint; invalid: none
	epoch  uint64         // guarded by mu: the Service's udpEpoch the target was judged at
	last   time.Time      // guarded by mu: the client's last datagram
}

func listenUDP(s *Service, addr func(*corev1.Pod) (netip.AddrPort, bool)) (*udpPort, error) {
	pc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(udpLoopback4)))
	if err != nil {
		return nil, err
	}
	return &udpPort{s: s, pc: pc, addr: addr, flows: map[netip.AddrPort]*udpFlow{}}, nil
}

// UDPAddr is the Service's UDP port (invalid without WithUDP).
func (s *Service) UDPAddr() netip.AddrPort {
	if s.udp == nil {
		return netip.AddrPort{}
	}
	return netip.MustParseAddrPort(s.udp.pc.LocalAddr().String())
}

// UDPDropped counts the datagrams the UDP port dropped for want of a selected Pod.
func (s *Service) UDPDropped() int {
	if s.udp == nil {
		return 0
	}
	s.udp.mu.Lock()
	defer s.udp.mu.Unlock()
	return s.udp.dropped
}

// udpChangedLocked recomputes the selected Pods' UDP addresses; a change is a new epoch, at
// which every flow judges its endpoint again.
func (s *Service) udpChangedLocked() {
	if s.udp == nil {
		return
	}
	var ends []netip.AddrPort
	for _, e := range s.pods {
		if e.selected && e.udp.IsValid() {
			ends = append(ends, e.udp)
		}
	}
	slices.SortFunc(ends, func(a, b netip.AddrPort) int { return a.Compare(b) })
	if !slices.Equal(ends, s.udpEnds) {
		s.udpEnds = ends // a new slice each time: snapshots of the old one stay as they were
		s.udpEpoch++
	}
}

// udpSnapshot is the selected UDP endpoints, their epoch, and the round-robin turn for a new
// flow.
func (s *Service) udpSnapshot() ([]netip.AddrPort, uint64, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.turn++
	return s.udpEnds, s.udpEpoch, s.turn
}

func (u *udpPort) serve() {
	defer u.wg.Wait()
	buf := make([]byte, maxDatagram)
	swept := time.Now()
	for {
		n, from, err := u.pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		now := time.Now()
		if now.Sub(swept) >= sweepEvery {
			u.sweep(now)
			swept = now
		}
		f := u.flow(from, now)
		if f == nil {
			u.drop()
			continue
		}
		to, ok := u.targetOf(f, now)
		if !ok {
			u.drop()
			continue
		}
		f.up.WriteToUDPAddrPort(buf[:n], to)
	}
}

func (u *udpPort) drop() {
	u.mu.Lock()
	u.dropped++
	u.mu.Unlock()
}

// flow is the client's flow, begun now if it has none; nil when the table is full or closed.
func (u *udpPort) flow(client netip.AddrPort, now time.Time) *udpFlow {
	u.mu.Lock()
	defer u.mu.Unlock()
	if f := u.flows[client]; f != nil || u.closed {
		return f
	}
	if len(u.flows) >= maxUDPFlows {
		return nil
	}
	up, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(udpLoopback4)))
	if err != nil {
		return nil
	}
	f := &udpFlow{client: client, up: up, last: now}
	u.flows[client] = f
	u.wg.Add(1)
	go func() { defer u.wg.Done(); u.replies(f) }()
	return f
}

// targetOf is the flow's endpoint for a datagram now: the one it has while that is still
// selected, else one selected now.
func (u *udpPort) targetOf(f *udpFlow, now time.Time) (netip.AddrPort, bool) {
	ends, epoch, turn := u.s.udpSnapshot()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last = now
	if f.epoch != epoch {
		f.epoch = epoch
		if !slices.Contains(ends, f.target) {
			f.target = netip.AddrPort{} // the endpoint left: kube-proxy deleted the entry
		}
	}
	if !f.target.IsValid() && len(ends) > 0 {
		f.target = ends[turn%len(ends)]
	}
	return f.target, f.target.IsValid()
}

// replies carries the flow's endpoint's datagrams back to the client until the flow ends.
func (u *udpPort) replies(f *udpFlow) {
	buf := make([]byte, maxDatagram)
	for {
		n, from, err := f.up.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		f.mu.Lock()
		ours := from == f.target
		f.mu.Unlock()
		if ours {
			u.pc.WriteToUDPAddrPort(buf[:n], f.client)
		}
	}
}

// sweep forgets the flows idle for udpFlowIdle.
func (u *udpPort) sweep(now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for client, f := range u.flows {
		f.mu.Lock()
		idle := now.Sub(f.last) >= udpFlowIdle
		f.mu.Unlock()
		if idle {
			f.up.Close()
			delete(u.flows, client)
		}
	}
}

// close ends the port and every flow.
func (u *udpPort) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	u.pc.Close()
	for client, f := range u.flows {
		f.up.Close()
		delete(u.flows, client)
	}
}
