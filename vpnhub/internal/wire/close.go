package wire

import (
	"errors"
	"strings"

	"github.com/quic-go/quic-go"

	"code.foss.global/serve.zone/relay/contracts"
)

// Refusals cross the wire as the reason phrase of a QUIC application close with code
// contracts.VPNCloseCodeRefused: "<name>: <reason>". The frame is not authenticated by Noise, so
// the client treats what it reads as a reason to redial, never as proof.

// CloseReason renders a refusal as a QUIC close reason phrase.
func CloseReason(r *contracts.Refusal) string { return r.Error() }

// FromCloseError turns a QUIC close the peer sent into the refusal it carries: an application
// close with code 1 whose reason starts with one of the VPN refusal names. Any other error is
// returned as is.
func FromCloseError(err error) error {
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

// IsRefusal reports whether err is a named refusal.
func IsRefusal(err error) bool {
	var r *contracts.Refusal
	return errors.As(err, &r)
}
