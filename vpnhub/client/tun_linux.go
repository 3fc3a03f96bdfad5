//go:build linux

package client

import (
	"fmt"
	"net/netip"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// TUN is a Linux TUN interface (IFF_TUN, no packet information header). It is a Device for a
// Tunnel. The interface lives in the network namespace of the thread that opened it.
//
// With offloads (OpenTUNOffload) the kernel hands over TCP super-packets of up to 64 KiB, which
// Read cuts into MTU-sized segments, and Write merges a burst of received segments of one TCP
// flow back into one write: far fewer system calls and far less kernel work per byte of TCP, as
// wireguard-go does.
type TUN struct {
	f       *os.File
	name    string
	offload bool

	rbuf    []byte   // owned by the reader: one read with its virtio-net header
	segBuf  []byte   // owned by the reader: the segments of the last super-packet
	pending [][]byte // owned by the reader: segments not yet returned

	wmu  sync.Mutex
	wbuf []byte // guarded by wmu: a write with its virtio-net header
}

// Linux TUN offload flags (linux/if_tun.h).
const (
	tunFCsum = 0x01
	tunFTSO4 = 0x02
)

// OpenTUN creates (or attaches to) the TUN interface name. It needs CAP_NET_ADMIN.
func OpenTUN(name string) (*TUN, error) { return openTUN(name, false) }

// OpenTUNOffload is OpenTUN with checksum and TCPv4 segmentation offloads (see TUN).
func OpenTUNOffload(name string) (*TUN, error) { return openTUN(name, true) }

func openTUN(name string, offload bool) (*TUN, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("vpnhub: open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vpnhub: tun name %q: %w", name, err)
	}
	flags := uint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if offload {
		flags |= unix.IFF_VNET_HDR
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vpnhub: create tun %s: %w", name, err)
	}
	t := &TUN{name: ifr.Name(), offload: offload}
	if offload {
		if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, tunFCsum|tunFTSO4); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("vpnhub: tun %s offloads: %w", name, err)
		}
		t.rbuf = make([]byte, virtioNetHdrLen+maxIPv4Packet)
		t.segBuf = make([]byte, 2*maxIPv4Packet)
		t.wbuf = make([]byte, virtioNetHdrLen+maxIPv4Packet)
	}
	// Non-blocking, so the runtime poller serves reads and Close wakes a blocked ReadPacket.
	t.f = os.NewFile(uintptr(fd), "/dev/net/tun")
	return t, nil
}

// Name is the interface's name.
func (t *TUN) Name() string { return t.name }

// BatchSize is how many packets one Read returns at most.
func (t *TUN) BatchSize() int {
	if t.offload {
		return maxCoalescedSegments
	}
	return 1
}

// Read reads the packets the kernel routes into the interface, one or (with offloads) the
// segments of one super-packet, into bufs[i][offset:]. One goroutine at a time may call it.
func (t *TUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if !t.offload {
		n, err := t.f.Read(bufs[0][offset:])
		if err != nil {
			return 0, err
		}
		sizes[0] = n
		return 1, nil
	}
	for len(t.pending) == 0 {
		n, err := t.f.Read(t.rbuf)
		if err != nil {
			return 0, err
		}
		if n <= virtioNetHdrLen {
			continue
		}
		var h virtioNetHdr
		h.decode(t.rbuf)
		p := t.rbuf[virtioNetHdrLen:n]
		switch h.gsoType &^ virtioGSOECN {
		case virtioGSONone:
			if h.flags&virtioNeedsCsum == 0 || finishChecksum(p, int(h.csumStart), int(h.csumOffset)) {
				t.pending = append(t.pending[:0], p)
			}
		case virtioGSOTCPv4:
			if segs, ok := segmentTCP4(p, int(h.gsoSize), t.segBuf, t.pending[:0]); ok {
				t.pending = segs
			}
		}
	}
	n := 0
	for ; n < len(bufs) && len(t.pending) > 0; n++ {
		sizes[n] = copy(bufs[n][offset:], t.pending[0])
		t.pending = t.pending[1:]
	}
	return n, nil
}

// Write hands packets bufs[i][offset:] to the kernel as if they arrived on the interface; with
// offloads, adjacent segments of one TCP flow go in one write.
func (t *TUN) Write(bufs [][]byte, offset int) (int, error) {
	if !t.offload {
		for i, b := range bufs {
			if _, err := t.f.Write(b[offset:]); err != nil {
				return i, err
			}
		}
		return len(bufs), nil
	}
	t.wmu.Lock()
	defer t.wmu.Unlock()
	err := coalesceTCP4(bufs, offset, t.wbuf, func(b []byte) error {
		_, err := t.f.Write(b)
		return err
	})
	if err != nil {
		return 0, err
	}
	return len(bufs), nil
}

// Close removes the interface (unless it was made persistent elsewhere).
func (t *TUN) Close() error { return t.f.Close() }

// Configure gives the interface an IPv4 address with the prefix's length, an MTU, and brings it
// up, as `ip addr add` and `ip link set up mtu` would. Call it in the interface's network
// namespace.
func (t *TUN) Configure(addr netip.Prefix, mtu int) error {
	return ConfigureInterface(t.name, addr, mtu)
}

// ConfigureInterface is Configure for the interface name.
func ConfigureInterface(name string, addr netip.Prefix, mtu int) error {
	t := struct{ name string }{name}
	if !addr.Addr().Is4() {
		return fmt.Errorf("vpnhub: tun %s: address %s is not IPv4", t.name, addr)
	}
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("vpnhub: tun %s: %w", t.name, err)
	}
	defer unix.Close(s)
	set := func(what string, req uint, fill func(*unix.Ifreq) error) error {
		ifr, err := unix.NewIfreq(t.name)
		if err == nil {
			err = fill(ifr)
		}
		if err == nil {
			err = unix.IoctlIfreq(s, req, ifr)
		}
		if err != nil {
			return fmt.Errorf("vpnhub: tun %s: set %s: %w", t.name, what, err)
		}
		return nil
	}
	a := addr.Addr().As4()
	var m [4]byte
	for i := 0; i < addr.Bits(); i++ {
		m[i/8] |= 0x80 >> (i % 8)
	}
	if err := set("address", unix.SIOCSIFADDR, func(r *unix.Ifreq) error { return r.SetInet4Addr(a[:]) }); err != nil {
		return err
	}
	if err := set("netmask", unix.SIOCSIFNETMASK, func(r *unix.Ifreq) error { return r.SetInet4Addr(m[:]) }); err != nil {
		return err
	}
	if err := set("mtu", unix.SIOCSIFMTU, func(r *unix.Ifreq) error { r.SetUint32(uint32(mtu)); return nil }); err != nil {
		return err
	}
	flags, err := unix.NewIfreq(t.name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, flags); err != nil {
		return fmt.Errorf("vpnhub: tun %s: read flags: %w", t.name, err)
	}
	up := flags.Uint16() | unix.IFF_UP | unix.IFF_RUNNING
	return set("up", unix.SIOCSIFFLAGS, func(r *unix.Ifreq) error { r.SetUint16(up); return nil })
}
