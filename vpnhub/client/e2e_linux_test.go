//go:build linux

package client

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// The real-packet end-to-end test: three network namespaces — the hub's and two nodes' — joined
// by veth pairs. Each node has a TUN interface driven by a Tunnel; the hub runs in this process on
// a socket bound inside its namespace. `ping` between the nodes' control addresses succeeds only
// through the hub.

// requireNetns skips the test, saying why, where network namespaces, TUN or ping are unavailable.
// With RELAY_REQUIRE_NETNS=1 (set by .ci/run on a root CI machine) it fails instead: `go test`
// without -v prints no skip, so a CI image that lost ping or /dev/net/tun would pass unnoticed.
func requireNetns(t *testing.T) {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("RELAY_REQUIRE_NETNS") == "1" {
		skip = t.Fatalf
	}
	if os.Geteuid() != 0 {
		skip("skipping the netns end-to-end test: needs root (CAP_NET_ADMIN) for network namespaces and TUN")
	}
	for _, tool := range []string{"ip", "ping"} {
		if _, err := exec.LookPath(tool); err != nil {
			skip("skipping the netns end-to-end test: %s not installed (Debian: iproute2, iputils-ping)", tool)
		}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		skip("skipping the netns end-to-end test: no /dev/net/tun: %v", err)
	}
	probe := fmt.Sprintf("vpnhub-probe-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		skip("skipping the netns end-to-end test: cannot create a network namespace: %v: %s", err, out)
	}
	exec.Command("ip", "netns", "del", probe).Run()
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// inNetns runs f on an OS thread moved into the named network namespace. Sockets and TUN
// interfaces f creates live in that namespace; f must not start goroutines that rely on it.
func inNetns(name string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open("/var/run/netns/" + name)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", name, err)
			return
		}
		err = f()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread() // else the thread ends with this goroutine, never reused
		}
		errc <- err
	}()
	return <-errc
}

// netnsTopology creates hub, a and b namespaces: the hub's address on its loopback, and a veth
// pair from the hub to each node, the node's default route through it.
type netnsTopology struct {
	hub, a, b string
	hubAddr   netip.Addr
}

func newNetnsTopology(t *testing.T) *netnsTopology {
	id := os.Getpid() % 100000
	n := &netnsTopology{
		hub: fmt.Sprintf("vpnhub-e2e-%d-hub", id), a: fmt.Sprintf("vpnhub-e2e-%d-a", id), b: fmt.Sprintf("vpnhub-e2e-%d-b", id),
		hubAddr: netip.MustParseAddr("10.201.0.1"),
	}
	for _, ns := range []string{n.hub, n.a, n.b} {
		exec.Command("ip", "netns", "del", ns).Run() // a leftover of a killed run
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "-n", n.hub, "addr", "add", n.hubAddr.String()+"/32", "dev", "lo")
	for i, node := range []string{n.a, n.b} {
		hubSide, nodeSide := fmt.Sprintf("vh%d%c", id, 'a'+i), fmt.Sprintf("vn%d%c", id, 'a'+i)
		run(t, "ip", "link", "add", hubSide, "netns", n.hub, "type", "veth", "peer", "name", nodeSide, "netns", node)
		run(t, "ip", "-n", n.hub, "addr", "add", fmt.Sprintf("10.201.%d.1/30", i+1), "dev", hubSide)
		run(t, "ip", "-n", node, "addr", "add", fmt.Sprintf("10.201.%d.2/30", i+1), "dev", nodeSide)
		run(t, "ip", "-n", n.hub, "link", "set", hubSide, "up")
		run(t, "ip", "-n", node, "link", "set", nodeSide, "up")
		run(t, "ip", "-n", node, "route", "add", "default", "via", fmt.Sprintf("10.201.%d.1", i+1))
	}
	return n
}

// startTunnel opens a TUN and a UDP socket inside ns and runs a Tunnel for the member there.
func startTunnel(t *testing.T, ns string, hub netip.AddrPort, hubKey [32]byte, key vpnkey.Pair, node string, addr netip.Addr, offload bool) *Tunnel {
	t.Helper()
	var tun *TUN
	var sock net.PacketConn
	err := inNetns(ns, func() error {
		var err error
		if sock, err = net.ListenUDP("udp4", &net.UDPAddr{}); err != nil {
			return err
		}
		open := OpenTUN
		if offload {
			open = OpenTUNOffload
		}
		if tun, err = open("vpn0"); err != nil {
			return err
		}
		return tun.Configure(netip.PrefixFrom(addr, 24), 1200)
	})
	if err != nil {
		t.Fatalf("tunnel in %s: %v", ns, err)
	}
	cl, err := New(Config{Hub: hub, HubKey: hubKey, AuthorityID: testAuthority, NodeID: node, Key: key, Conn: sock,
		Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	joined := make(chan struct{}, 1)
	tu := &Tunnel{Client: cl, Device: tun, Logger: testLogger(t), OnJoin: func(*Conn) {
		select {
		case joined <- struct{}{}:
		default:
		}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tu.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		cl.Close()
		sock.Close()
	})
	select {
	case <-joined:
	case err := <-done:
		t.Fatalf("tunnel %s ended: %v", node, err)
	case <-time.After(15 * time.Second):
		t.Fatalf("tunnel %s did not join", node)
	}
	return tu
}

func TestPingAcrossTheHubBetweenNetworkNamespaces(t *testing.T) {
	requireNetns(t)
	checkLeaks(t)
	topo := newNetnsTopology(t)

	var sock net.PacketConn
	if err := inNetns(topo.hub, func() (err error) {
		sock, err = net.ListenUDP("udp4", &net.UDPAddr{IP: topo.hubAddr.AsSlice()})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	hubKey := testKey(t, 1)
	reg := prometheus.NewRegistry()
	h, err := vpnhub.Listen(vpnhub.Config{Conn: sock, Key: hubKey}, vpnhub.Options{Logger: testLogger(t), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if ep := h.Endpoint(); ep.Address != topo.hubAddr.String() || ep.QUICPort == 0 || ep.NoisePublicKey != contracts.EncodeKey32(hubKey.Public) {
		t.Fatalf("endpoint %+v", ep)
	}
	ctx, cancel := context.WithCancel(context.Background())
	hubDone := make(chan error, 1)
	go func() { hubDone <- h.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-hubDone })

	ka, kb := testKey(t, 2), testKey(t, 3)
	expires := time.Now().Add(time.Hour).UnixMilli()
	ma, mb := testMember(ka, "node-a", 2), testMember(kb, "node-b", 3)
	ma.ExpiresAt, mb.ExpiresAt = expires, expires
	if _, err := h.PushMembership(contracts.EncodeVPNMembershipPush(contracts.VPNMembership{AuthorityID: testAuthority,
		ControlPrefix: netip.MustParsePrefix("10.64.0.0/24"), Generation: 1, Members: []contracts.VPNMember{ma, mb}})); err != nil {
		t.Fatal(err)
	}
	hubAt := netip.AddrPortFrom(topo.hubAddr, uint16(h.Endpoint().QUICPort))
	startTunnel(t, topo.a, hubAt, hubKey.Public, ka, "node-a", addrA, true) // with TCP offloads
	startTunnel(t, topo.b, hubAt, hubKey.Public, kb, "node-b", addrB, false)

	for _, c := range []struct{ ns, to string }{{topo.a, addrB.String()}, {topo.b, addrA.String()}} {
		out, err := exec.Command("ip", "netns", "exec", c.ns, "ping", "-c", "3", "-i", "0.2", "-W", "3", c.to).CombinedOutput()
		if err != nil {
			t.Fatalf("ping %s from %s: %v\n%s", c.to, c.ns, err, out)
		}
		if !strings.Contains(string(out), " 0% packet loss") {
			t.Fatalf("ping %s from %s lost packets:\n%s", c.to, c.ns, out)
		}
	}
	// Each ping is an echo request and a reply through the hub: at least 12 packets.
	if got := gauge(t, reg, "relay_vpnhub_forwarded_packets_total"); got < 12 {
		t.Fatalf("forwarded_packets_total = %v after two pings of 3", got)
	}
	tcpAcross(t, topo)
	// Nothing reaches a node by any other path: a ping to the other node's underlay address fails.
	if err := exec.Command("ip", "netns", "exec", topo.a, "ping", "-c", "1", "-W", "1", "10.201.2.2").Run(); err == nil {
		t.Fatal("node a reaches node b's underlay: the test would not prove the hub carries the ping")
	}
}

// tcpAcross moves 4 MiB each way over TCP between the nodes' control addresses: segments cut
// from node a's TSO super-packets and merged again on its side must arrive intact.
func tcpAcross(t *testing.T, topo *netnsTopology) {
	t.Helper()
	var ln net.Listener
	if err := inNetns(topo.b, func() (err error) {
		ln, err = net.Listen("tcp4", addrB.String()+":7000")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i*131 + i>>9)
	}
	echoed := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			echoed <- err
			return
		}
		defer c.Close()
		buf := make([]byte, len(data))
		if _, err := io.ReadFull(c, buf); err != nil {
			echoed <- err
			return
		}
		_, err = c.Write(buf) // back the same way: b's plain TUN to a's merging one
		echoed <- err
	}()
	var c net.Conn
	if err := inNetns(topo.a, func() (err error) {
		c, err = net.DialTimeout("tcp4", addrB.String()+":7000", 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	go c.Write(data)
	back := make([]byte, len(data))
	if _, err := io.ReadFull(c, back); err != nil {
		t.Fatalf("tcp through the hub: %v", err)
	}
	if err := <-echoed; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, data) {
		t.Fatal("tcp data changed on its way through the hub")
	}
}
