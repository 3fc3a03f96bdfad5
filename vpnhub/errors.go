package vpnhub

import (
	"errors"
	"strings"

	"github.com/quic-go/quic-go"

	"code.foss.global/serve.zone/relay/contracts"
)

// Named errors of the hub and its client. A refusal that crosses the wire is a
// *contracts.Refusal under one of contracts.VPNRefusals, carried as the reason phrase of a QUIC
// application close with code contracts.VPNCloseCodeRefused; test it with errors.Is(err,
// contracts.VPNMemberRemoved).

var (
	// ErrClosed is returned by a client Conn's methods after Close.
	ErrClosed = errors.New("vpnhub: connection closed")
	// ErrListenAddress is a hub listen address that names no concrete IPv4 address to bind.
	ErrListenAddress = errors.New("must name the IPv4 address the hub binds inside vpn.hubPrefix, with a port (e.g. 192.0.2.1:4433)")
	// ErrNoDatagrams is a QUIC connection without DATAGRAM support on both sides.
	ErrNoDatagrams = errors.New("vpnhub: the QUIC connection does not support DATAGRAM frames")
	// ErrPacketTooLarge is a packet larger than the session's MTU.
	ErrPacketTooLarge = errors.New("vpnhub: packet larger than the session mtu")
	// ErrHandshake is a handshake that broke off: a message the client cannot read, or a payload
	// that breaks SPEC §7.
	ErrHandshake = errors.New("vpnhub: handshake failed")
)

// closeReason renders a refusal as a QUIC close reason phrase: "<name>: <reason>".
func closeReason(r *contracts.Refusal) string { return r.Error() }

// fromCloseError turns a QUIC close the hub sent into the refusal it carries: an application close
// with code 1 whose reason starts with one of the VPN refusal names. Any other error is returned
// as is.
func fromCloseError(err error) error {
	var app *quic.ApplicationError
	if !errors.As(err, &app) || !app.Remote || app.ErrorCode != contracts.VPNCloseCodeRefused {
		return err
	}
	name, reason, _ := strings.Cut(app.ErrorMessage, ":")
	for _, n := range contracts.VPNRefusals() {
		if string(n) == name {
			return n.Refuse("%s", strings.TrimSpace(reason))
		}
	}
	return err
}
