package vpnhub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlogwriter"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
)

// ClientConfig is what a node's managed VPN credential gives it (the hub tuple, the Noise server
// key, the managed authority id, its own key pair) plus local options. Zero values are defaults.
type ClientConfig struct {
	Hub         netip.AddrPort
	HubKey      [32]byte
	AuthorityID string
	NodeID      string
	Key         StaticKey

	// Conn, when set, is the local UDP socket to dial from (tests bind one inside a network
	// namespace); the client does not close it. Nil: a new socket on an ephemeral port.
	Conn              net.PacketConn
	InitialPacketSize uint16        // 0: quic-go's 1280
	HandshakeTimeout  time.Duration // 0: 5 s
	IdleTimeout       time.Duration // 0: 30 s
	Logger            zerolog.Logger
	// QUICTracer, when set, traces the QUIC connection (qlog); for diagnosis only.
	QUICTracer func(ctx context.Context, isClient bool, connID quic.ConnectionID) qlogwriter.Trace
}

// Client dials a hub as one member. One Client may dial again and again (Tunnel does after a lost
// connection); each Dial is a new session, which replaces the member's previous one at the hub.
type Client struct {
	cfg  ClientConfig // set at construction, defaults filled
	tr   *quic.Transport
	owns net.PacketConn // the socket NewClient opened, closed by Close
}

// NewClient prepares a client; it opens a local UDP socket unless cfg.Conn is set.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	switch {
	case !cfg.Hub.IsValid():
		return nil, errors.New("vpnhub: client: no hub address")
	case !contracts.IsCanonicalID(cfg.AuthorityID):
		return nil, errors.New("vpnhub: client: authority id must be a canonical identifier")
	case !contracts.IsClusterNodeID(cfg.NodeID):
		return nil, errors.New("vpnhub: client: node id must be a cluster node id")
	}
	cl := &Client{cfg: cfg}
	conn := cfg.Conn
	if conn == nil {
		udp, err := net.ListenUDP("udp4", &net.UDPAddr{})
		if err != nil {
			return nil, fmt.Errorf("vpnhub: client socket: %w", err)
		}
		conn, cl.owns = udp, udp
	}
	cl.tr = &quic.Transport{Conn: conn}
	return cl, nil
}

// Close closes the client's transport (and every Conn dialled through it).
func (cl *Client) Close() error {
	err := cl.tr.Close()
	if cl.owns != nil {
		cl.owns.Close()
	}
	return err
}

// Dial opens a session: QUIC, then the Noise handshake. A refusal is returned as the
// *contracts.Refusal the hub closed the connection with (errors.Is(err, contracts.VPNMemberUnknown)).
func (cl *Client) Dial(ctx context.Context) (*Conn, error) {
	deadline := time.Now().Add(cl.cfg.HandshakeTimeout)
	hctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	qc, err := cl.tr.Dial(hctx, net.UDPAddrFromAddrPort(cl.cfg.Hub), clientTLSConfig(), &quic.Config{
		EnableDatagrams: true, InitialPacketSize: cl.cfg.InitialPacketSize, HandshakeIdleTimeout: cl.cfg.HandshakeTimeout,
		MaxIdleTimeout: cl.cfg.IdleTimeout, KeepAlivePeriod: keepAlivePeriod, MaxIncomingStreams: -1, MaxIncomingUniStreams: -1,
		Tracer: cl.cfg.QUICTracer,
	})
	if err != nil {
		return nil, fmt.Errorf("vpnhub: dial hub %s: %w", cl.cfg.Hub, err)
	}
	c, err := cl.handshake(hctx, qc, deadline)
	if err != nil {
		qc.CloseWithError(contracts.VPNCloseCodeNone, "handshake failed")
		return nil, err
	}
	return c, nil
}

func (cl *Client) handshake(ctx context.Context, qc *quic.Conn, deadline time.Time) (*Conn, error) {
	stream, err := qc.OpenStreamSync(ctx)
	if err != nil {
		return nil, fmt.Errorf("vpnhub: open handshake stream: %w", fromCloseError(err))
	}
	stream.SetDeadline(deadline)
	ini, msg1, err := startHandshake(&cl.cfg.Key, cl.cfg.HubKey, cl.cfg.AuthorityID, cl.cfg.NodeID, nil)
	if err != nil {
		return nil, err
	}
	if err := writeFrame(stream, msg1); err != nil {
		return nil, fmt.Errorf("vpnhub: write message 1: %w", fromCloseError(err))
	}
	msg2, err := readFrame(stream, maxHandshakeMessage)
	if err != nil {
		if cause := context.Cause(qc.Context()); cause != nil {
			err = cause // the hub's close, which carries its refusal
		}
		if ref := fromCloseError(err); isRefusal(ref) {
			return nil, ref
		}
		return nil, fmt.Errorf("vpnhub: read message 2: %w", err)
	}
	welcome, keys, err := ini.finish(msg2)
	if err != nil {
		return nil, err
	}
	stream.SetDeadline(time.Time{})
	own, err := datagramMTU(qc)
	if err != nil {
		return nil, err
	}
	c := &Conn{
		qc: qc, stream: stream, welcome: welcome, mtu: min(welcome.MTU, own),
		seal: newSealer(keys.send, welcome.MTU), open: newOpener(keys.recv), inbox: newPacketQueue(clientInboxLen),
	}
	go c.drainLoop()
	return c, nil
}

func isRefusal(err error) bool {
	var r *contracts.Refusal
	return errors.As(err, &r)
}

// Conn is one member session with the hub: send and receive IP packets.
type Conn struct {
	qc      *quic.Conn
	stream  *quic.Stream // the handshake stream, open for the life of the session
	welcome contracts.VPNWelcome
	mtu     int // the largest packet WritePacket takes

	sendMu sync.Mutex
	seal   *sealer // guarded by sendMu

	recvMu sync.Mutex
	open   *opener      // guarded by recvMu
	inbox  *packetQueue // pushed by drainLoop, popped by ReceivePacket

	dropped atomic.Int64 // datagrams from the hub that did not open, were replayed, or overflowed
}

// clientInboxLen is how many datagrams a Conn holds that ReceivePacket has not taken yet.
const clientInboxLen = 1024

// drainLoop moves datagrams out of quic-go's 128-datagram receive queue into the inbox as they
// arrive (see the hub's session.drainLoop), until the connection ends.
func (c *Conn) drainLoop() {
	for {
		d, err := c.qc.ReceiveDatagram(context.Background())
		if err != nil {
			return
		}
		if c.inbox.push(d) {
			c.dropped.Add(1)
		}
	}
}

// ControlAddress is the member's address inside the tunnel (message 2).
func (c *Conn) ControlAddress() netip.Addr { return c.welcome.ControlAddress }

// MTU is the largest packet WritePacket sends: the hub's mtu, or less if this side's datagrams are
// smaller.
func (c *Conn) MTU() int { return c.mtu }

// ExpiresAt is the member's expiry (Unix ms) the hub stated.
func (c *Conn) ExpiresAt() int64 { return c.welcome.ExpiresAt }

// Dropped counts datagrams from the hub that were replayed or did not authenticate.
func (c *Conn) Dropped() int64 { return c.dropped.Load() }

// WritePacket seals one IP packet and sends it. It may wait while QUIC's datagram queue is full.
func (c *Conn) WritePacket(p []byte) error {
	if len(p) > c.mtu {
		return ErrPacketTooLarge
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	d, ok := c.seal.seal(p)
	if !ok {
		return ErrClosed
	}
	if err := c.qc.SendDatagram(d); err != nil {
		return c.closeErr(err)
	}
	return nil
}

// writeRaw sends a datagram as is (tests replay and forge datagrams with it).
func (c *Conn) writeRaw(d []byte) error { return c.qc.SendDatagram(d) }

// ReceivePacket waits for the next IP packet from the hub and returns it; the caller owns it.
// Datagrams that do not open or are replayed are skipped and counted (Dropped). One goroutine at
// a time may call it.
func (c *Conn) ReceivePacket(ctx context.Context) ([]byte, error) {
	for {
		d := c.inbox.pop()
		if d == nil {
			select {
			case <-c.inbox.ready:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-c.qc.Context().Done():
				if d = c.inbox.pop(); d == nil {
					return nil, c.closeErr(context.Cause(c.qc.Context()))
				}
			}
		}
		c.recvMu.Lock()
		p, reason := c.open.open(d)
		c.recvMu.Unlock()
		if reason == dropNone {
			return p, nil
		}
		c.dropped.Add(1)
	}
}

// ReceivePackets waits for at least one IP packet from the hub and appends it, and every other
// one already there, to dst. The caller owns the packets. One goroutine at a time may call it.
func (c *Conn) ReceivePackets(ctx context.Context, dst [][]byte) ([][]byte, error) {
	p, err := c.ReceivePacket(ctx)
	if err != nil {
		return dst, err
	}
	dst = append(dst, p)
	start := len(dst)
	dst = c.inbox.popAll(dst)
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	out := dst[:start]
	for _, d := range dst[start:] {
		if p, reason := c.open.open(d); reason == dropNone {
			out = append(out, p)
		} else {
			c.dropped.Add(1)
		}
	}
	clear(dst[len(out):])
	return out, nil
}

// Done is closed when the session has ended; Err then says why.
func (c *Conn) Done() <-chan struct{} { return c.qc.Context().Done() }

// Err is why the session ended: the hub's refusal (errors.Is(err, contracts.VPNMemberRemoved)),
// ErrClosed after Close, or the connection's error. Nil while it lasts.
func (c *Conn) Err() error {
	cause := context.Cause(c.qc.Context())
	if cause == nil {
		return nil
	}
	return c.closeErr(cause)
}

func (c *Conn) closeErr(err error) error {
	if cause := context.Cause(c.qc.Context()); cause != nil {
		err = cause
	}
	var app *quic.ApplicationError
	if errors.As(err, &app) && !app.Remote {
		return ErrClosed
	}
	return fromCloseError(err)
}

// Close ends the session.
func (c *Conn) Close() error {
	return c.qc.CloseWithError(contracts.VPNCloseCodeNone, "member leaving")
}
