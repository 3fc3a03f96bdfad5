package client

import (
	"errors"

	"code.foss.global/serve.zone/relay/vpnhub/internal/wire"
)

// Named errors of the client. A refusal the hub closes a connection with is returned as the
// *contracts.Refusal it names: test it with errors.Is(err, contracts.VPNMemberRemoved).
var (
	// ErrClosed is returned by a Conn's methods after Close.
	ErrClosed = errors.New("vpnhub client: connection closed")
	// ErrPacketTooLarge is a packet larger than the session's MTU.
	ErrPacketTooLarge = errors.New("vpnhub client: packet larger than the session mtu")
	// ErrHandshake is a handshake that broke off: a message 2 the client cannot read, or a payload
	// that breaks docs/protocol.md#vpn-hub.
	ErrHandshake = wire.ErrHandshake
	// ErrNoDatagrams is a QUIC connection without DATAGRAM support on both sides.
	ErrNoDatagrams = wire.ErrNoDatagrams
)
