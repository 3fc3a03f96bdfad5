package vpnhub

import "code.foss.global/serve.zone/relay/vpnhub/internal/wire"

// forward is the hub's data plane for one datagram from src (docs/protocol.md#vpn-hub): open it, check the inner
// source is src's control address, look the destination up, and queue the packet for the member
// there, whose send loop seals it again. An empty packet is a keep-alive: it proves the session
// live and goes nowhere. forward runs on src's receive loop, never blocks and allocates nothing:
// the packet is decrypted in place and the queue takes the datagram's buffer.
func (h *Hub) forward(src *session, datagram []byte) {
	if !h.serving() { // fenced, or the tenure lapsed: the sessions are being closed, nothing more crosses
		h.dropped(src, dropStandby)
		return
	}
	packet, verdict := src.open.Open(datagram)
	if verdict != wire.Opened {
		h.dropped(src, openDrops[verdict])
		return
	}
	if !src.heard {
		src.heard = true
		src.live.Store(true)
	}
	if len(packet) == 0 {
		h.m.keepAlives.Inc()
		return
	}
	from, to, ok := wire.IPv4Addrs(packet)
	if !ok {
		h.dropped(src, dropMalformed)
		return
	}
	if from != src.addr {
		h.dropped(src, dropSpoofed)
		return
	}
	now := h.clock.Now().UnixMilli()
	if now >= src.expiresAt.Load() {
		h.dropped(src, dropExpired)
		return
	}
	if notUnicast(to, h.view.Load().broadcast) {
		h.dropped(src, dropNotUnicast)
		return
	}
	dst := h.route(to)
	switch {
	case dst == nil:
		h.dropped(src, dropUnknownDest)
	case now >= dst.expiresAt.Load():
		h.dropped(src, dropExpired)
	case len(packet) > dst.mtu:
		h.dropped(src, dropTooLarge)
	case dst.queue.push(packet):
		h.dropped(dst, dropQueueFull)
	}
}

// openDrops names the drop of each verdict of Opener.Open but Opened.
var openDrops = [...]dropReason{wire.Malformed: dropMalformed, wire.Replayed: dropReplayed, wire.Unauthenticated: dropUnauthenticated}

// dropped counts a dropped packet and logs it at debug level, once a second per reason at most.
// The log names the member and the reason, never the packet.
func (h *Hub) dropped(s *session, r dropReason) {
	h.m.drop(r)
	if e := h.log.Debug(); e != nil {
		if h.logs.allow(int(r), h.clock.Now()) {
			e.Str("node", s.member.NodeID).Str("reason", r.String()).Msg("vpn packet dropped")
		} else {
			e.Discard()
		}
	}
}
