//go:build !linux

package typedsocket

import "net"

// watchHangup cannot watch a socket here: a waiting read ends with its connection only.
func watchHangup(net.Conn) (<-chan struct{}, func()) { return nil, nil }
