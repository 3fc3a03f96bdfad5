// Package vpnhub is the cluster's managed VPN hub and its Go client (SPEC §7): QUIC with DATAGRAM,
// a Noise IK handshake on the first stream, and a data plane that forwards IP packets between
// member nodes. It owns the hub's static key, membership and sessions; it never learns or logs a
// member's private key.
package vpnhub
