// Package vpnhub is the cluster's managed VPN hub (docs/protocol.md#vpn-hub): QUIC with DATAGRAM, a Noise IK
// handshake on the first stream, and a data plane that forwards IP packets between member nodes.
// It owns the hub's membership and sessions; it never learns or logs a member's private key, and
// never reads more of a packet than its IPv4 addresses. The Go client is vpnhub/client, the key
// pairs and the hub's key file vpnhub/vpnkey, the bytes both sides share vpnhub/internal/wire; the
// wire shapes and constants live in contracts/vpn.go.
//
// # Protocol flow
//
//	Cloudly ──pushClusterVpnMembership──► relay ──► Hub.PushMembership (membership.go)
//	node ──QUIC v1, ALPN servezone-vpnhub──► Hub (hub.go: admission in ratelimit.go)
//	     ──stream 0: len‖Noise IK msg1 {nodeId, timestamp}──► respond (handshake.go, no I/O),
//	                                                          then register: timestamp > last for the key
//	     ◄─stream 0: len‖msg2 {controlAddress,mtu,expiresAt}── or close(1, "vpn-…: reason")
//	     ══datagrams: counter‖ChaCha20-Poly1305(packet)══► receiveLoop → forward (forward.go)
//	                                                       → other member's packetQueue (queue.go)
//	                                                       → its sendLoop seals ══► node
//	     an empty packet is a keep-alive; none authenticated within 15 s: close(1, "vpn-session-silent")
//
// # Files
//
//   - hub.go: Listen, Endpoint, PushMembership, Run; session table, routes, hello timestamps and
//     the expiry timer.
//   - session.go: one member's connection: receive and send loops, stream watcher, silence timer,
//     shut.
//   - forward.go: the data plane for one datagram, allocation-free.
//   - handshake.go: the judgement of message 1.
//   - lead.go: whether the hub's relay leads (several relays per cluster): a standby's hub refuses
//     handshakes (vpn-hub-standby) and a fenced one closes its sessions.
//   - replica.go: the membership copied to the standbys' hubs (feature.Replicated), in records
//     under vpn/, read strictly.
//   - quickeys.go: the QUIC stateless-reset and token keys, derived from the hub key so that every
//     replica resets a connection another one held.
//   - membership.go, packet.go, queue.go, ratelimit.go: the pieces forward and handshake use.
//   - clock.go, errors.go, metrics.go: time, named errors and relay_vpnhub_* metrics.
//
// # Ownership
//
// One goroutine owns each piece of per-packet state: a session's opener and replay window belong
// to its receive loop, its sealer to its send loop. Receive loops of any session push into
// another session's queue, which drops its oldest packet when full, so no member waits for
// another. quic-go's receive queue holds only 128 datagrams per connection; the socket under the
// hub (vpnhub/quicsock) hands quic-go no more of a member's packets than its receive loop has room
// for, so a burst waits in the kernel's socket buffer rather than being dropped unseen.
// Membership, the session table, the hello timestamps, the expiry timer and the replication
// state are guarded by Hub.mu; the route table by Hub.routesMu, read once per packet.
package vpnhub
