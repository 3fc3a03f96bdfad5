package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/quic-go/quic-go"

	"code.foss.global/serve.zone/relay/contracts"
)

// ErrNoDatagrams is a QUIC connection without DATAGRAM support on both sides.
var ErrNoDatagrams = errors.New("vpnhub: the QUIC connection does not support DATAGRAM frames")

// datagramProbe is larger than any DATAGRAM frame, so SendDatagram refuses it and states the
// connection's largest datagram payload. It is never written to.
var datagramProbe = make([]byte, 1<<14+1)

// DatagramMTU is the largest inner packet conn carries: its largest datagram payload less the
// counter and tag.
func DatagramMTU(conn *quic.Conn) (int, error) {
	if st := conn.ConnectionState(); !st.SupportsDatagrams.Remote || !st.SupportsDatagrams.Local {
		return 0, ErrNoDatagrams
	}
	var tooLarge *quic.DatagramTooLargeError
	if err := conn.SendDatagram(datagramProbe); !errors.As(err, &tooLarge) {
		return 0, fmt.Errorf("vpnhub: probe datagram size: %v", err)
	}
	mtu := min(int(tooLarge.MaxDatagramPayloadSize)-contracts.VPNDataOverhead, contracts.VPNMaxMTU)
	if mtu < contracts.VPNMinMTU {
		return 0, fmt.Errorf("vpnhub: datagrams of %d bytes carry no IPv4 packet", tooLarge.MaxDatagramPayloadSize)
	}
	return mtu, nil
}

// IPv4Addrs returns the source and destination of a well-formed IPv4 packet: version 4, a header
// of at least 20 bytes that fits, and a total length equal to the packet's. Anything else (IPv6, a
// truncated or padded packet) is not ok. Nothing else of a packet is ever read.
func IPv4Addrs(p []byte) (src, dst uint32, ok bool) {
	if len(p) < 20 || p[0]>>4 != 4 {
		return 0, 0, false
	}
	ihl := int(p[0]&0x0f) * 4
	if ihl < 20 || ihl > len(p) || int(binary.BigEndian.Uint16(p[2:4])) != len(p) {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(p[12:16]), binary.BigEndian.Uint32(p[16:20]), true
}

// AddrU32 is an IPv4 address as a big-endian integer.
func AddrU32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}
