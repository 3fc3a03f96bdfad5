package sim

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub/client"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// VPN members for the simulator: each VPNNode holds a node's managed VPN credential (its key pair
// and control address), joins the relay's hub with the vpnhub client and exchanges real IP packets
// with other VPNNodes through it. VPNMembershipBody is what the Cloudly stand-in pushes so that
// the hub knows them.

// Defaults of the simulated managed VPN.
const (
	SimVPNAuthority = "authority-sim"
)

// SimVPNControlPrefix is the control prefix the simulated members are numbered from.
var SimVPNControlPrefix = netip.MustParsePrefix("10.88.0.0/16")

// VPNNode is one node's managed VPN client.
type VPNNode struct {
	ID      string
	Key     vpnkey.Pair
	Address netip.Addr // control address
	// LightSocket dials from a plain UDP socket instead of the client's batched one (quicsock,
	// about 1 MiB of buffers per socket): for hundreds of members in one process, as `relay-dev`
	// runs them. The protocol is the same; only the member's own socket I/O differs.
	LightSocket bool

	log      zerolog.Logger
	received atomic.Int64 // packets delivered to this node by its peers

	mu     sync.Mutex
	client *client.Client // guarded by mu
	conn   *client.Conn   // guarded by mu
	done   chan struct{}  // guarded by mu: closed when the receive loop ends
	sock   net.PacketConn // guarded by mu: the LightSocket the client dials from
}

// plainPacketConn hides a *net.UDPConn's type, so that the client and quic-go treat it as any
// packet socket: no batching, no offloads. It keeps the buffer sizes quic-go asks for (quic-go
// warns on standard error about a socket that cannot set them).
type plainPacketConn struct {
	net.PacketConn
	udp *net.UDPConn
}

func (c plainPacketConn) SetReadBuffer(n int) error  { return c.udp.SetReadBuffer(n) }
func (c plainPacketConn) SetWriteBuffer(n int) error { return c.udp.SetWriteBuffer(n) }

// NewVPNNodes makes members for ids with fresh keys and control addresses numbered from the
// prefix's second address.
func NewVPNNodes(prefix netip.Prefix, log zerolog.Logger, ids ...string) ([]*VPNNode, error) {
	nodes := make([]*VPNNode, len(ids))
	a := prefix.Addr()
	for i, id := range ids {
		k, err := vpnkey.Generate()
		if err != nil {
			return nil, err
		}
		a = a.Next()
		if !contracts.IsVPNControlAddress(prefix, a) {
			return nil, fmt.Errorf("prefix %s holds fewer than %d members", prefix, len(ids))
		}
		nodes[i] = &VPNNode{ID: id, Key: k, Address: a,
			log: log.With().Str("component", "sim-vpn").Str("node", id).Logger()}
	}
	return nodes, nil
}

// VPNMembershipBody builds pushClusterVpnMembership's request for nodes, each valid until
// expiresAt (Unix ms).
func VPNMembershipBody(authorityID string, prefix netip.Prefix, generation, expiresAt int64, nodes []*VPNNode) json.RawMessage {
	m := contracts.VPNMembership{AuthorityID: authorityID, ControlPrefix: prefix, Generation: generation}
	for _, n := range nodes {
		m.Members = append(m.Members, contracts.VPNMember{NodeID: n.ID, PublicKey: n.Key.Public, ControlAddress: n.Address, ExpiresAt: expiresAt})
	}
	return contracts.EncodeVPNMembershipPush(m)
}

// HubTarget reads the hub a relay reported with registerClusterVpnHub (Cloudly.VPNHub): where
// nodes dial it and its Noise key, as a node's managed VPN credential names them.
func HubTarget(r contracts.ClusterVpnHubReport) (netip.AddrPort, [32]byte, error) {
	a, err := netip.ParseAddr(r.Hub.Address)
	if err != nil || !a.Is4() {
		return netip.AddrPort{}, [32]byte{}, fmt.Errorf("hub address %q is not an IPv4 literal", r.Hub.Address)
	}
	return netip.AddrPortFrom(a, uint16(r.Hub.QUICPort)), r.NoisePublicKey, nil
}

// Join dials the hub at addr with hubKey under authorityID and starts counting the packets the
// node receives. It returns the hub's refusal (a *contracts.Refusal) when the hub refuses.
func (n *VPNNode) Join(ctx context.Context, addr netip.AddrPort, hubKey [32]byte, authorityID string) error {
	cfg := client.Config{Hub: addr, HubKey: hubKey, AuthorityID: authorityID, NodeID: n.ID, Key: n.Key, Logger: n.log}
	var sock net.PacketConn
	if n.LightSocket {
		udp, err := net.ListenUDP("udp4", &net.UDPAddr{})
		if err != nil {
			return fmt.Errorf("node %s: vpn socket: %w", n.ID, err)
		}
		sock, cfg.Conn = udp, plainPacketConn{udp, udp}
	}
	closeAll := func(cl *client.Client) {
		if cl != nil {
			cl.Close()
		}
		if sock != nil {
			sock.Close()
		}
	}
	cl, err := client.New(cfg)
	if err != nil {
		closeAll(nil)
		return err
	}
	conn, err := cl.Dial(ctx)
	if err != nil {
		closeAll(cl)
		return err
	}
	if conn.ControlAddress() != n.Address {
		conn.Close()
		closeAll(cl)
		return fmt.Errorf("node %s: hub gave control address %s, membership says %s", n.ID, conn.ControlAddress(), n.Address)
	}
	done := make(chan struct{})
	n.mu.Lock()
	n.client, n.conn, n.done, n.sock = cl, conn, done, sock
	n.mu.Unlock()
	go func() {
		defer close(done)
		for {
			p, err := conn.ReceivePacket(context.Background())
			if err != nil {
				return
			}
			if len(p) >= 20 && netip.AddrFrom4([4]byte(p[16:20])) == n.Address {
				n.received.Add(1)
			}
		}
	}()
	return nil
}

// ErrNotJoined is returned by Send before Join.
var ErrNotJoined = errors.New("sim: vpn node has not joined the hub")

// Send sends count UDP packets of size bytes (at least 28) from n to peer through the hub and
// returns how many were handed to the hub.
func (n *VPNNode) Send(peer *VPNNode, count, size int) (int, error) {
	n.mu.Lock()
	conn := n.conn
	n.mu.Unlock()
	if conn == nil {
		return 0, ErrNotJoined
	}
	size = min(max(size, 28), conn.MTU())
	for i := 0; i < count; i++ {
		if err := conn.WritePacket(udpPacket(n.Address, peer.Address, uint32(i), size)); err != nil {
			return i, err
		}
	}
	return count, nil
}

// Received counts packets addressed to this node that arrived through the hub.
func (n *VPNNode) Received() int64 { return n.received.Load() }

// Err is why the node's session ended (the hub's refusal, such as vpn-member-removed), or nil
// while it lasts or before Join.
func (n *VPNNode) Err() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return nil
	}
	return n.conn.Err()
}

// Close leaves the hub.
func (n *VPNNode) Close() {
	n.mu.Lock()
	cl, conn, done, sock := n.client, n.conn, n.done, n.sock
	n.client, n.conn, n.done, n.sock = nil, nil, nil, nil
	n.mu.Unlock()
	if conn != nil {
		conn.Close()
		<-done
		cl.Close()
	}
	if sock != nil {
		sock.Close()
	}
}

// udpPacket is an IPv4/UDP packet of size bytes from src to dst, its sequence in the payload.
func udpPacket(src, dst netip.Addr, seq uint32, size int) []byte {
	p := make([]byte, size)
	p[0], p[8], p[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(p[2:], uint16(size))
	s, d := src.As4(), dst.As4()
	copy(p[12:16], s[:])
	copy(p[16:20], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(p[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(p[10:], ^uint16(sum))
	binary.BigEndian.PutUint16(p[20:], 40000)
	binary.BigEndian.PutUint16(p[22:], 40001)
	binary.BigEndian.PutUint16(p[24:], uint16(size-20))
	if size >= 32 {
		binary.BigEndian.PutUint32(p[28:], seq)
	}
	return p
}
