package vpnhub

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/quic-go/quic-go"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub/internal/wire"
	"code.foss.global/serve.zone/relay/vpnhub/quicsock"
)

// session is one member's connection to the hub. Three goroutines under one context: the receive
// loop (datagrams out of quic-go, opened and forwarded to other members), the send loop (the
// member's queue out, sealed) and a watcher on the handshake stream, whose end ends the session.
// A timer closes it as vpn-session-silent if no datagram of it has authenticated within
// contracts.VPNSilentTimeout of its handshake.
type session struct {
	hub       *Hub
	conn      *quic.Conn
	stream    *quic.Stream
	member    contracts.VPNMember // set at construction; ExpiresAt there is the handshake's
	authority string              // set at construction: the authority the handshake ran under
	addr      uint32              // set at construction: the control address
	mtu       int                 // set at construction: the largest inner packet sent to it
	hello     int64               // set at construction: message 1's timestamp, Unix µs
	expiresAt atomic.Int64        // Unix ms; updated by newer memberships
	queue     *packetQueue        // pushed by any receiveLoop, popped by sendLoop
	open      *wire.Opener        // owned by receiveLoop
	heard     bool                // owned by receiveLoop: a datagram of this session authenticated
	live      atomic.Bool         // heard, for the silence timer
	seal      *wire.Sealer        // owned by sendLoop
	flow      *quicsock.Flow      // set by run: what receiveLoop reports to the socket's reader; nil: none
	msg2      []byte              // set at construction: handshake message 2, sent after register

	ctx    context.Context
	cancel context.CancelCauseFunc
	once   sync.Once
}

func newSession(h *Hub, conn *quic.Conn, stream *quic.Stream, acc accepted, mtu int) *session {
	s := &session{
		hub: h, conn: conn, stream: stream, member: acc.member, authority: acc.authority,
		addr: wire.AddrU32(acc.member.ControlAddress), mtu: mtu, hello: acc.timestamp,
		queue: newPacketQueue(h.cfg.QueueLen),
		open:  wire.NewOpener(acc.keys.Recv), seal: wire.NewSealer(acc.keys.Send, mtu),
		msg2: acc.msg2,
	}
	s.expiresAt.Store(acc.member.ExpiresAt)
	s.ctx, s.cancel = context.WithCancelCause(conn.Context())
	return s
}

var errSessionEnded = errors.New("vpnhub: session ended")

// run serves the session until it ends.
func (s *session) run() {
	silence := s.hub.clock.AfterFunc(contracts.VPNSilentTimeout, func() {
		if !s.live.Load() {
			s.shut(contracts.VPNCloseCodeRefused, contracts.VPNSessionSilent.Refuse(
				"node %s sent no authenticated datagram within %s of its handshake", s.member.NodeID, contracts.VPNSilentTimeout),
				string(contracts.VPNSessionSilent))
		}
	})
	defer silence.Stop()
	if b := s.hub.batch; b != nil {
		if ap, err := netip.ParseAddrPort(s.conn.RemoteAddr().String()); err == nil {
			s.flow = b.Flow(ap)
			defer s.flow.Close()
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.sendLoop() }()
	go func() {
		defer wg.Done()
		io.Copy(io.Discard, s.stream) // returns when the member ends the stream or the connection
		s.shut(contracts.VPNCloseCodeNone, nil, closeLeft)
	}()
	s.receiveLoop()
	s.shut(contracts.VPNCloseCodeNone, nil, closeLeft)
	wg.Wait()
}

// shut ends the session once: out of the hub's tables, its connection closed with code and the
// refusal's reason phrase (none: an ordinary close), counted under label.
func (s *session) shut(code quic.ApplicationErrorCode, ref *contracts.Refusal, label string) {
	s.once.Do(func() {
		s.hub.detach(s)
		s.cancel(errSessionEnded)
		msg := "session ended"
		if ref != nil {
			msg = wire.CloseReason(ref)
		} else if label == closeShutdown {
			msg = "hub shutting down"
		}
		s.conn.CloseWithError(code, msg)
		s.hub.m.closed(label)
		e := s.hub.log.Info().Str("node", s.member.NodeID).Str("key", contracts.ShortKey(s.member.PublicKey)).Str("outcome", label)
		if ref != nil {
			e = e.Str("reason", ref.Reason)
		}
		e.Msg("vpn member session closed")
	})
}

// receiveLoop takes the member's datagrams out of quic-go's receive queue, which holds 128 and
// drops beyond, and forwards each at once: forward never blocks. The socket's reader hands quic-go
// no more of the member's packets than the window this loop reports its progress to (flow), so
// the queue cannot overflow while the loop is not scheduled; the backlog waits in the kernel.
func (s *session) receiveLoop() {
	for {
		d, err := s.conn.ReceiveDatagram(s.ctx)
		if err != nil {
			return
		}
		s.hub.forward(s, d)
		if s.flow != nil {
			s.flow.Drained()
		}
	}
}

// sendLoop seals and sends the member's queued packets. SendDatagram may block while quic-go's
// own queue is full; only this loop waits then, never the hub.
func (s *session) sendLoop() {
	var batch [][]byte
	for {
		select {
		case <-s.queue.ready:
		case <-s.ctx.Done():
			return
		}
		batch = s.queue.popAll(batch[:0])
		for i, p := range batch {
			batch[i] = nil
			if !s.send(p) {
				return
			}
		}
	}
}

// send seals p and hands it to QUIC. It reports false when the session cannot send any more.
func (s *session) send(p []byte) bool {
	d, ok := s.seal.Seal(p)
	if !ok {
		go s.shut(contracts.VPNCloseCodeNone, nil, closeLeft) // counter space spent: the member joins again
		return false
	}
	if err := s.conn.SendDatagram(d); err != nil {
		var tooLarge *quic.DatagramTooLargeError
		if errors.As(err, &tooLarge) {
			s.hub.m.drop(dropTooLarge)
			return true
		}
		return false
	}
	s.hub.m.packets.Inc()
	s.hub.m.bytes.Add(float64(len(p)))
	return true
}
