package vpnhub

import "errors"

// Named errors of the hub. A refusal that crosses the wire is a *contracts.Refusal under one of
// contracts.VPNRefusals, carried as the reason phrase of a QUIC application close with code
// contracts.VPNCloseCodeRefused (internal/wire/close.go); test it with errors.Is(err,
// contracts.VPNMemberRemoved).

// ErrListenAddress is a hub listen address that names no concrete IPv4 address to bind.
var ErrListenAddress = errors.New("must name the IPv4 address the hub binds inside vpn.hubPrefix, with a port (e.g. 192.0.2.1:4433)")

// ErrReplicaRecord is a membership record copied from the HA leader (replica.go) that does not
// read; the error names the record and what was wrong, never a key.
var ErrReplicaRecord = errors.New("vpnhub: replicated membership record does not read")
