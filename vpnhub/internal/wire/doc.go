// Package wire is what the VPN hub and its client must agree on byte for byte (docs/protocol.md#vpn-hub), with no
// I/O and no state beyond one direction's keys: the Noise IK handshake's two halves
// (handshake.go), the length framing of handshake messages (framing.go), sealing and opening data
// datagrams with their replay window (datagram.go, replay.go), the throwaway QUIC TLS
// configuration (tls.go), refusals in QUIC close frames (close.go), and the few facts read from a
// connection or an inner packet (conn.go). The wire shapes and constants themselves live in
// contracts/vpn.go.
package wire
