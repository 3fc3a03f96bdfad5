//go:build !linux

package quicsock

import (
	"net"
	"net/netip"
)

// Conn is the socket as it is where the batching system calls are Linux's: no flusher, and flows
// that count nothing.
type Conn struct {
	*net.UDPConn
	flows *flows
}

// New wraps c.
func New(c *net.UDPConn) *Conn { return &Conn{UDPConn: c, flows: newFlows()} }

// Flow registers the datagrams from addr; nothing waits for it here.
func (c *Conn) Flow(addr netip.AddrPort) *Flow { return c.flows.flow(addr) }

// Stop does nothing: there is no flusher.
func (c *Conn) Stop() {}
