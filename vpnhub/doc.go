// Package vpnhub is the cluster's managed VPN hub and its Go client (SPEC §7): QUIC with DATAGRAM,
// a Noise IK handshake on the first stream, and a data plane that forwards IP packets between
// member nodes. It owns the hub's static key, membership and sessions; it never learns or logs a
// member's private key, and never reads more of a packet than its IPv4 addresses. The wire shapes
// and constants live in contracts/vpn.go.
//
// # Protocol flow
//
//	Cloudly ──pushClusterVpnMembership──► relay ──► Hub.PushMembership (membership.go)
//	node ──QUIC v1, ALPN servezone-vpnhub──► Hub (hub.go: admission in ratelimit.go)
//	     ──stream 0: len‖Noise IK msg1 {nodeId}──►        respond (handshake.go, no I/O)
//	     ◄─stream 0: len‖msg2 {controlAddress,mtu,expiresAt}── or close(1, "vpn-…: reason")
//	     ══datagrams: counter‖ChaCha20-Poly1305(packet)══► drainLoop → inbox → forwardLoop → forward
//	                                                       → other member's packetQueue (queue.go)
//	                                                       → its sendLoop seals (datagram.go) ══► node
//
// # Files
//
//   - hub.go: Listen, Endpoint, PushMembership, Run; session table, routes and expiry timer.
//   - session.go: one member's connection: drain, forward and send loops, stream watcher, shut.
//   - forward.go: the data plane for one datagram, allocation-free.
//   - handshake.go, framing.go: the Noise IK state machines and their 2-byte length framing.
//   - datagram.go, replay.go: sealing and opening datagrams, the replay window.
//   - membership.go, packet.go, queue.go, ratelimit.go: the pieces forward and handshake use.
//   - client.go, tunnel.go, tun_linux.go: the Go client, its reconnecting Tunnel, a Linux TUN.
//   - key.go, tls.go, clock.go: static keys and their file, the throwaway QUIC certificate, time.
//   - errors.go, metrics.go: named errors and relay_vpnhub_* metrics.
//
// # Ownership
//
// One goroutine owns each piece of per-packet state: a session's opener and replay window belong
// to its forward loop, its sealer to its send loop. Forward loops of any session push into another
// session's queue, which drops its oldest packet when full, so no member waits for another. Each
// session's drain loop only moves datagrams out of quic-go's small receive queue into the
// session's inbox, so a burst is queued rather than dropped unseen.
// Membership, the session table and the expiry timer are guarded by Hub.mu; the route table by
// Hub.routesMu, read once per packet.
package vpnhub
