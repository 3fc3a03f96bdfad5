package client

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/backoff"
	"code.foss.global/serve.zone/relay/vpnhub/internal/wire"
)

// Device is a packet device a Tunnel carries: a TUN interface, or an in-memory device in tests.
// Its methods are golang.zx2c4.com/wireguard/tun.Device's: a batch of packets per call, each
// packet at bufs[i][offset:], so that a device with offloads can prepend its virtio-net header
// without a copy.
type Device interface {
	// Read reads up to len(bufs) packets, packet i into bufs[i][offset:] with its length in
	// sizes[i], and returns how many. It blocks until there is one or the device is closed.
	Read(bufs [][]byte, sizes []int, offset int) (int, error)
	// Write writes the packets bufs[i][offset:] and returns how many it took.
	Write(bufs [][]byte, offset int) (int, error)
	// BatchSize is how many packets one Read may return.
	BatchSize() int
	Close() error
}

// deviceOffset is the headroom before each packet handed to a Device: room for a virtio-net
// header (10 bytes), rounded up.
const deviceOffset = 16

// Tunnel keeps one member joined and carries IP packets between a Device and the hub. It dials
// again after every lost session and every refusal, vpn-member-replaced included (docs/protocol.md#vpn-hub: a
// refusal arrives in an unauthenticated QUIC close frame, so it may be forged), waiting by the
// shared backoff schedule (internal/backoff: 250 ms to 30 s, full jitter). The schedule starts
// again after a session that lasted stableSession, so that two tunnels holding the same key
// replace each other at the schedule's pace, not as fast as they can dial; and after a session
// the hub ended with a stateless reset (it lost the session's state: a failover), so that the
// member is back within the schedule's first wait.
type Tunnel struct {
	Client *Client
	Device Device
	Logger zerolog.Logger
	// OnJoin, when set, is called with each new session (the control address and mtu are known
	// then).
	OnJoin func(*Conn)

	cur      atomic.Pointer[Conn] // the session packets from the device go to; nil between sessions
	sent     atomic.Int64
	received atomic.Int64
	dropped  atomic.Int64
	joins    atomic.Int64
}

// stableSession is how long a session must last for the redial schedule to start again.
const stableSession = 10 * time.Second

// hubLostState reports a session that ended in a QUIC stateless reset: the hub's address answered
// for the connection without knowing it, with the token only a holder of the hub key derives —
// the hub restarted, or another replica of it leads now (a failover). Nothing the member did
// ended the session, and two members sharing a key never reset each other (they are replaced by
// a refusal), so the redial schedule starts again: the member is back after its shortest wait.
func hubLostState(err error) bool {
	var reset *quic.StatelessResetError
	return errors.As(err, &reset)
}

// Sent counts packets sent to the hub; Received packets from the hub written to the device;
// Dropped packets the device gave while no session was up, that were too large, or not from the
// member's own control address; Joins the sessions the tunnel opened.
func (t *Tunnel) Sent() int64     { return t.sent.Load() }
func (t *Tunnel) Received() int64 { return t.received.Load() }
func (t *Tunnel) Dropped() int64  { return t.dropped.Load() }
func (t *Tunnel) Joins() int64    { return t.joins.Load() }

// Run carries packets until ctx ends. It closes the device when it returns.
func (t *Tunnel) Run(ctx context.Context) error {
	log := t.Logger.With().Str("component", "vpnhub-client").Str("node", t.Client.cfg.NodeID).Logger()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); t.fromDevice() }()
	defer func() { t.Device.Close(); wg.Wait() }()

	wait := backoff.New()
	for {
		conn, err := t.Client.Dial(ctx)
		if err == nil {
			joined := t.Client.cfg.Clock.Now()
			t.joins.Add(1)
			log.Info().Str("controlAddress", conn.ControlAddress().String()).Int("mtu", conn.MTU()).Str("outcome", "joined").Msg("vpn session up")
			t.cur.Store(conn)
			if t.OnJoin != nil {
				t.OnJoin(conn)
			}
			err = t.toDevice(ctx, conn)
			t.cur.Store(nil)
			conn.Close()
			if t.Client.cfg.Clock.Since(joined) >= stableSession || hubLostState(err) {
				wait.Reset()
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		outcome := "dial-failed"
		var ref *contracts.Refusal
		if errors.As(err, &ref) { // however the dial wrapped it: the hub may refuse before message 1 is written
			outcome = string(ref.Name)
		} else if hubLostState(err) {
			outcome = "hub-reset"
		}
		sleep := wait.Next()
		log.Warn().Str("outcome", outcome).Dur("wait", sleep).Str("error", err.Error()).Msg("vpn session down")
		timer := t.Client.cfg.Clock.NewTimer(sleep)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C():
		}
	}
}

// toDevice writes the session's packets to the device until the session ends, a burst at a time.
func (t *Tunnel) toDevice(ctx context.Context, conn *Conn) error {
	bufs := make([][]byte, max(t.Device.BatchSize(), 64))
	for i := range bufs {
		bufs[i] = make([]byte, deviceOffset+contracts.VPNMaxMTU)
	}
	for {
		n, err := conn.ReceivePackets(ctx, bufs, deviceOffset)
		if err != nil {
			return err
		}
		if _, err := t.Device.Write(bufs[:n], deviceOffset); err != nil {
			return err
		}
		t.received.Add(int64(n))
	}
}

// fromDevice sends the device's packets on the current session until the device is closed.
// Packets that are not IPv4 from the member's control address are dropped here: the hub would
// drop them anyway.
func (t *Tunnel) fromDevice() {
	batch := max(t.Device.BatchSize(), 1)
	bufs, sizes := make([][]byte, batch), make([]int, batch)
	for i := range bufs {
		bufs[i] = make([]byte, deviceOffset+contracts.VPNMaxMTU)
	}
	for {
		n, err := t.Device.Read(bufs, sizes, deviceOffset)
		if err != nil {
			return
		}
		conn := t.cur.Load()
		for i := range n {
			p := bufs[i][deviceOffset : deviceOffset+sizes[i]]
			if conn == nil {
				t.dropped.Add(1)
				continue
			}
			src, _, ok := wire.IPv4Addrs(p)
			if !ok || src != wire.AddrU32(conn.ControlAddress()) {
				t.dropped.Add(1)
				continue
			}
			if err := conn.WritePacket(p); err != nil {
				t.dropped.Add(1)
				continue
			}
			t.sent.Add(1)
		}
	}
}
