// Package client is the Go client of the cluster's managed VPN hub (docs/protocol.md#vpn-hub): it dials the hub as
// one member, runs the Noise IK handshake, and sends and receives IP packets as QUIC datagrams
// (Client, Conn); Tunnel keeps a member joined and carries packets between the hub and a Device,
// a Linux TUN interface (TUN, golang.zx2c4.com/wireguard/tun's) in production. It is used by the tests, the simulator and the
// benchmarks, and is what a node implementation written in Go would run. It never logs a packet or
// a private key.
//
// # Protocol flow
//
//	Client.Dial ──QUIC v1, ALPN servezone-vpnhub──► hub
//	            ──stream 0: len‖Noise IK msg1 {nodeId, timestamp}──►
//	            ◄─stream 0: len‖msg2 {controlAddress, mtu, expiresAt}── or close(1, "vpn-…: reason")
//	Conn        ══datagrams: counter‖ChaCha20-Poly1305(packet)══ both ways; an empty packet right
//	              after the handshake and after every idle interval (keep-alive)
//	Tunnel      Device.Read ─► Conn.WritePacket;  drainLoop ─► inbox ─► Conn.ReceivePackets ─► Device.Write
//	            on any end or refusal: redial after internal/backoff's wait, never stop
//
// # Files
//
//   - client.go: Client (dial, handshake) and Conn (send, receive, keep-alive).
//   - inbox.go: the bounded queue between a Conn's drain loop and its receivers.
//   - tunnel.go: Device and Tunnel, the reconnecting carrier.
//   - tun_linux.go: the Linux TUN, with TCP and UDP segmentation and coalescing offloads.
//   - errors.go: named errors.
package client
