package client

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
	"k8s.io/utils/clock"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub/internal/wire"
	"code.foss.global/serve.zone/relay/vpnhub/quicsock"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// Config is what a node's managed VPN credential gives it (the hub tuple, the Noise server key,
// the managed authority id, its own key pair) plus local options. Zero values are defaults.
type Config struct {
	Hub         netip.AddrPort
	HubKey      [32]byte
	AuthorityID string
	NodeID      string
	Key         vpnkey.Pair

	// Conn, when set, is the local UDP socket to dial from (tests bind one inside a network
	// namespace); the client does not close it. Nil: a new socket on an ephemeral port.
	Conn              net.PacketConn
	InitialPacketSize uint16        // 0: quic-go's 1280
	HandshakeTimeout  time.Duration // 0: 5 s
	IdleTimeout       time.Duration // 0: 30 s
	// KeepAliveInterval is how long a session may send nothing before it sends an empty
	// keep-alive datagram; 0: contracts.VPNKeepAliveInterval (docs/protocol.md#vpn-hub). Tests shorten it.
	KeepAliveInterval time.Duration
	// Clock runs the keep-alive cadence and a Tunnel's redial waits; nil is the wall clock. Tests
	// inject one they move. The handshake's and QUIC's own timeouts run on the wall clock.
	Clock  clock.WithTicker
	Logger zerolog.Logger
	// QUICTracer, when set, traces the QUIC connection (qlog); for diagnosis only.
	QUICTracer func(ctx context.Context, isClient bool, connID quic.ConnectionID) qlogwriter.Trace
}

// Defaults.
const (
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultIdleTimeout      = 30 * time.Second
	quicKeepAlivePeriod     = 10 * time.Second // QUIC PINGs while nothing else is sent
)

// Client dials a hub as one member. One Client may dial again and again (Tunnel does after a lost
// connection or a refusal); each Dial is a new session, which replaces the member's previous one
// at the hub.
type Client struct {
	cfg   Config // set at construction, defaults filled
	tr    *quic.Transport
	owns  net.PacketConn // the socket New opened, closed by Close
	batch *quicsock.Conn // the socket wrapped for batched sends and receives; nil: not a UDP socket

	helloMu   sync.Mutex
	lastHello int64 // guarded by helloMu: the last message 1 timestamp sent, Unix µs
}

// New prepares a client; it opens a local UDP socket unless cfg.Conn is set.
func New(cfg Config) (*Client, error) {
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.KeepAliveInterval <= 0 {
		cfg.KeepAliveInterval = contracts.VPNKeepAliveInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	switch {
	case !cfg.Hub.IsValid():
		return nil, errors.New("vpnhub client: no hub address")
	case !contracts.IsCanonicalID(cfg.AuthorityID):
		return nil, errors.New("vpnhub client: authority id must be a canonical identifier")
	case !contracts.IsClusterNodeID(cfg.NodeID):
		return nil, errors.New("vpnhub client: node id must be a cluster node id")
	}
	cl := &Client{cfg: cfg}
	conn := cfg.Conn
	if conn == nil {
		sock, err := net.ListenUDP("udp4", &net.UDPAddr{})
		if err != nil {
			return nil, fmt.Errorf("vpnhub client socket: %w", err)
		}
		conn, cl.owns = sock, sock
	}
	if sock, ok := conn.(*net.UDPConn); ok {
		cl.batch = quicsock.New(sock)
		conn = cl.batch
	}
	cl.tr = &quic.Transport{Conn: conn}
	return cl, nil
}

// Close closes the client's transport (and every Conn dialled through it).
func (cl *Client) Close() error {
	err := cl.tr.Close()
	if cl.batch != nil {
		cl.batch.Stop()
	}
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
	qc, err := cl.tr.Dial(hctx, net.UDPAddrFromAddrPort(cl.cfg.Hub), wire.ClientTLSConfig(), &quic.Config{
		EnableDatagrams: true, InitialPacketSize: cl.cfg.InitialPacketSize, HandshakeIdleTimeout: cl.cfg.HandshakeTimeout,
		MaxIdleTimeout: cl.cfg.IdleTimeout, KeepAlivePeriod: quicKeepAlivePeriod, MaxIncomingStreams: -1, MaxIncomingUniStreams: -1,
		Tracer: cl.cfg.QUICTracer,
	})
	if err != nil {
		return nil, fmt.Errorf("vpnhub client: dial hub %s: %w", cl.cfg.Hub, wire.FromCloseError(err)) // the hub may refuse before the dial has returned
	}
	c, err := cl.handshake(hctx, qc, deadline)
	if err != nil {
		qc.CloseWithError(contracts.VPNCloseCodeNone, "handshake failed")
		return nil, err
	}
	return c, nil
}

// helloTimestamp is now in Unix µs, or one more than the last one sent if the clock stepped back:
// the hub refuses a timestamp that does not grow (vpn-handshake-replayed).
func (cl *Client) helloTimestamp() int64 {
	cl.helloMu.Lock()
	defer cl.helloMu.Unlock()
	cl.lastHello = max(time.Now().UnixMicro(), cl.lastHello+1)
	return cl.lastHello
}

func (cl *Client) handshake(ctx context.Context, qc *quic.Conn, deadline time.Time) (*Conn, error) {
	stream, err := qc.OpenStreamSync(ctx)
	if err != nil {
		return nil, fmt.Errorf("vpnhub client: open handshake stream: %w", wire.FromCloseError(err))
	}
	stream.SetDeadline(deadline)
	hello := contracts.VPNHello{NodeID: cl.cfg.NodeID, Timestamp: cl.helloTimestamp()}
	ini, msg1, err := wire.StartHandshake(&cl.cfg.Key, cl.cfg.HubKey, cl.cfg.AuthorityID, hello, nil)
	if err != nil {
		return nil, err
	}
	if err := wire.WriteFrame(stream, msg1); err != nil {
		return nil, fmt.Errorf("vpnhub client: write message 1: %w", wire.FromCloseError(err))
	}
	msg2, err := wire.ReadFrame(stream, wire.MaxHandshakeMessage)
	if err != nil {
		if cause := context.Cause(qc.Context()); cause != nil {
			err = cause // the hub's close, which carries its refusal
		}
		if ref := wire.FromCloseError(err); wire.IsRefusal(ref) {
			return nil, ref
		}
		return nil, fmt.Errorf("vpnhub client: read message 2: %w", err)
	}
	welcome, keys, err := ini.Finish(msg2)
	if err != nil {
		return nil, err
	}
	stream.SetDeadline(time.Time{})
	own, err := wire.DatagramMTU(qc)
	if err != nil {
		return nil, err
	}
	c := newConn(qc, stream, welcome, min(welcome.MTU, own), keys, cl.cfg.Clock.NewTicker(cl.cfg.KeepAliveInterval/2))
	if cl.batch != nil {
		c.flow = cl.batch.Flow(cl.cfg.Hub)
	}
	go c.drainLoop()
	return c, nil
}

// Conn is one member session with the hub: send and receive IP packets. Two goroutines of its own
// run until the session ends: the drain loop, which moves datagrams out of quic-go's small
// receive queue into the Conn's inbox, and the keep-alive loop.
type Conn struct {
	qc      *quic.Conn
	stream  *quic.Stream // the handshake stream, open for the life of the session
	welcome contracts.VPNWelcome
	mtu     int // the largest packet WritePacket takes

	sendMu sync.Mutex
	seal   *wire.Sealer // guarded by sendMu
	sent   bool         // guarded by sendMu: a datagram left since the keep-alive loop last looked

	recvMu sync.Mutex
	open   *wire.Opener // guarded by recvMu
	inbox  *inbox       // pushed by drainLoop, popped by the receive methods

	dropped atomic.Int64   // datagrams from the hub that did not open, were replayed, or overflowed
	flow    *quicsock.Flow // set at construction: the hub's datagrams drainLoop reports; nil: none
}

// newConn starts the session's keep-alives on tick, which it stops once the session ends.
func newConn(qc *quic.Conn, stream *quic.Stream, w contracts.VPNWelcome, mtu int, keys wire.TransportKeys, tick clock.Ticker) *Conn {
	c := &Conn{
		qc: qc, stream: stream, welcome: w, mtu: mtu,
		seal: wire.NewSealer(keys.Send, w.MTU), open: wire.NewOpener(keys.Recv), inbox: newInbox(inboxLen),
	}
	go c.keepAliveLoop(tick)
	return c
}

// inboxLen is how many datagrams a Conn holds that the receive methods have not taken yet.
const inboxLen = 1024

// drainLoop moves datagrams out of quic-go's 128-datagram receive queue, which drops beyond,
// into the inbox as they arrive, until the connection ends.
func (c *Conn) drainLoop() {
	for {
		d, err := c.qc.ReceiveDatagram(context.Background())
		if err != nil {
			if c.flow != nil {
				c.flow.Close()
			}
			c.inbox.close()
			return
		}
		if c.flow != nil {
			c.flow.Drained()
		}
		if !c.inbox.push(d) {
			c.dropped.Add(1)
		}
	}
}

// keepAliveLoop sends an empty keep-alive datagram right away (the hub closes a session that has
// not authenticated a datagram within 15 s of its handshake) and then whenever nothing was sent
// for a whole interval, looking twice an interval (tick) so that no idle gap exceeds it.
func (c *Conn) keepAliveLoop(tick clock.Ticker) {
	defer tick.Stop()
	idle := true // send the first one now
	for {
		if idle {
			if err := c.write(nil); err != nil && c.qc.Context().Err() != nil {
				return
			}
		}
		select {
		case <-c.qc.Context().Done():
			return
		case <-tick.C():
		}
		c.sendMu.Lock()
		idle, c.sent = !c.sent, false
		c.sendMu.Unlock()
	}
}

// ControlAddress is the member's address inside the tunnel (message 2).
func (c *Conn) ControlAddress() netip.Addr { return c.welcome.ControlAddress }

// MTU is the largest packet WritePacket sends: the hub's mtu, or less if this side's datagrams are
// smaller.
func (c *Conn) MTU() int { return c.mtu }

// ExpiresAt is the member's expiry (Unix ms) the hub stated.
func (c *Conn) ExpiresAt() int64 { return c.welcome.ExpiresAt }

// Dropped counts datagrams from the hub that were replayed, did not authenticate, or overflowed
// the inbox.
func (c *Conn) Dropped() int64 { return c.dropped.Load() }

// WritePacket seals one IP packet and sends it. It may wait while QUIC's datagram queue is full.
func (c *Conn) WritePacket(p []byte) error {
	if len(p) > c.mtu {
		return ErrPacketTooLarge
	}
	return c.write(p)
}

func (c *Conn) write(p []byte) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	d, ok := c.seal.Seal(p)
	if !ok {
		return ErrClosed
	}
	c.sent = true
	if err := c.qc.SendDatagram(d); err != nil {
		return c.closeErr(err)
	}
	return nil
}

// ReceivePacket waits for the next IP packet from the hub and returns it, decrypted in the
// datagram's own buffer; the caller owns it. Datagrams that do not open or are replayed are
// skipped and counted (Dropped); keep-alives are skipped. One goroutine at a time may call it.
func (c *Conn) ReceivePacket(ctx context.Context) ([]byte, error) {
	for {
		d, err := c.next(ctx)
		if err != nil {
			return nil, err
		}
		c.recvMu.Lock()
		p, verdict := c.open.Open(d)
		c.recvMu.Unlock()
		switch {
		case verdict != wire.Opened:
			c.dropped.Add(1)
		case len(p) > 0:
			return p, nil
		}
	}
}

// ReceivePackets waits for at least one IP packet from the hub, then decrypts it and every other
// one already there, up to len(bufs), into bufs[i][offset:], reslicing bufs[i] to end with the
// packet (each needs room for offset+MTU bytes), and returns how many. Keep-alives and datagrams
// that do not open are skipped. One goroutine at a time may call it.
func (c *Conn) ReceivePackets(ctx context.Context, bufs [][]byte, offset int) (int, error) {
	var held [64][]byte
	for {
		d, err := c.next(ctx)
		if err != nil {
			return 0, err
		}
		burst := append(held[:0], d)
		burst = c.inbox.popAll(burst[:1:min(len(bufs), len(held))])
		n := 0
		c.recvMu.Lock()
		for _, d := range burst {
			p, verdict := c.open.OpenTo(bufs[n][:offset], d)
			switch {
			case verdict != wire.Opened:
				c.dropped.Add(1)
			case len(p) > offset:
				bufs[n] = p
				n++
			}
		}
		c.recvMu.Unlock()
		clear(burst)
		if n > 0 {
			return n, nil
		}
	}
}

// next waits for the next datagram from the hub.
func (c *Conn) next(ctx context.Context) ([]byte, error) {
	for {
		if d := c.inbox.pop(); d != nil {
			return d, nil
		}
		select {
		case <-c.inbox.ready:
		case <-c.inbox.done:
			if d := c.inbox.pop(); d != nil {
				return d, nil
			}
			return nil, c.closeErr(context.Cause(c.qc.Context()))
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
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
	return wire.FromCloseError(err)
}

// Close ends the session.
func (c *Conn) Close() error {
	return c.qc.CloseWithError(contracts.VPNCloseCodeNone, "member leaving")
}
