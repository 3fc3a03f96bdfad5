//go:build linux

package client

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
	wgtun "golang.zx2c4.com/wireguard/tun"
)

// TUN is a Linux TUN interface (IFF_TUN, no packet information header), a Device for a Tunnel.
// It is golang.zx2c4.com/wireguard/tun's: with offloads (OpenTUNOffload) the kernel hands over
// TCP and UDP super-packets of up to 64 KiB, which Read cuts into MTU-sized segments, and Write
// merges a burst of received segments of one flow back into one write, as wireguard-go does. The
// interface lives in the network namespace of the thread that opened it.
type TUN struct {
	wgtun.Device
	name string
}

// OpenTUN creates (or attaches to) the TUN interface name, one packet per read and write. It
// needs CAP_NET_ADMIN.
func OpenTUN(name string) (*TUN, error) { return openTUN(name, false) }

// OpenTUNOffload is OpenTUN with TCP and UDP segmentation and coalescing offloads.
func OpenTUNOffload(name string) (*TUN, error) { return openTUN(name, true) }

func openTUN(name string, offload bool) (*TUN, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
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
	// Unmonitored: none of the link-state goroutines wireguard-go runs for itself.
	dev, got, err := wgtun.CreateUnmonitoredTUNFromFD(fd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vpnhub: tun %s: %w", name, err)
	}
	return &TUN{Device: dev, name: got}, nil
}

// Name is the interface's name.
func (t *TUN) Name() string { return t.name }

// Configure gives the interface an IPv4 address with the prefix's length, an MTU, and brings it
// up, as `ip addr add` and `ip link set up mtu` would. Call it in the interface's network
// namespace.
func (t *TUN) Configure(addr netip.Prefix, mtu int) error {
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
