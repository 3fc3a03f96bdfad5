package vpnhub

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
)

// Device is a packet device a Tunnel carries: a TUN interface (tun_linux.go) or an in-memory
// device in tests. ReadPacket blocks until a packet is there or the device is closed.
type Device interface {
	ReadPacket(buf []byte) (int, error)
	WritePacket(p []byte) error
	Close() error
}

// Tunnel keeps one member joined and carries IP packets between a Device and the hub. After a
// lost connection or a refusal it dials again with exponential backoff and full jitter (250 ms to
// 30 s), except after vpn-member-replaced: another session holds the key, and dialling again
// would take it back.
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
}

// Backoff bounds of a Tunnel's redial.
const (
	redialMin = 250 * time.Millisecond
	redialMax = 30 * time.Second
)

// Sent counts packets sent to the hub; Received packets from the hub written to the device;
// Dropped packets the device gave while no session was up, that were too large, or not from the
// member's own control address.
func (t *Tunnel) Sent() int64     { return t.sent.Load() }
func (t *Tunnel) Received() int64 { return t.received.Load() }
func (t *Tunnel) Dropped() int64  { return t.dropped.Load() }

// Run carries packets until ctx ends or the member is replaced. It closes the device when it
// returns.
func (t *Tunnel) Run(ctx context.Context) error {
	log := t.Logger.With().Str("component", "vpnhub-client").Str("node", t.Client.cfg.NodeID).Logger()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); t.fromDevice() }()
	defer func() { t.Device.Close(); wg.Wait() }()

	wait := redialMin
	for {
		conn, err := t.Client.Dial(ctx)
		if err == nil {
			wait = redialMin
			log.Info().Str("controlAddress", conn.ControlAddress().String()).Int("mtu", conn.MTU()).Str("outcome", "joined").Msg("vpn session up")
			t.cur.Store(conn)
			if t.OnJoin != nil {
				t.OnJoin(conn)
			}
			err = t.toDevice(ctx, conn)
			t.cur.Store(nil)
			conn.Close()
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, contracts.VPNMemberReplaced) {
			log.Warn().Str("outcome", string(contracts.VPNMemberReplaced)).Msg("vpn session replaced by a newer one: not dialling again")
			return err
		}
		outcome := "dial-failed"
		if name := contracts.ReadRefusalName(err.Error(), nil); name != "" {
			outcome = string(name)
		}
		sleep := time.Duration(rand.Int64N(int64(wait)))
		log.Warn().Str("outcome", outcome).Dur("wait", sleep).Str("error", err.Error()).Msg("vpn session down")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(sleep):
		}
		wait = min(2*wait, redialMax)
	}
}

// BatchWriter is a Device that takes a burst of packets at once (a TUN with offloads merges
// them).
type BatchWriter interface {
	WritePackets(pkts [][]byte) error
}

// toDevice writes the session's packets to the device until the session ends, a burst at a time.
func (t *Tunnel) toDevice(ctx context.Context, conn *Conn) error {
	bw, batches := t.Device.(BatchWriter)
	var batch [][]byte
	for {
		var err error
		batch, err = conn.ReceivePackets(ctx, batch[:0])
		if err != nil {
			return err
		}
		if batches {
			err = bw.WritePackets(batch)
		} else {
			for _, p := range batch {
				if err = t.Device.WritePacket(p); err != nil {
					break
				}
			}
		}
		if err != nil {
			return err
		}
		t.received.Add(int64(len(batch)))
		clear(batch)
	}
}

// fromDevice sends the device's packets on the current session until the device is closed.
// Packets that are not IPv4 from the member's control address are dropped here: the hub would
// drop them anyway.
func (t *Tunnel) fromDevice() {
	buf := make([]byte, contracts.VPNMaxMTU)
	for {
		n, err := t.Device.ReadPacket(buf)
		if err != nil {
			return
		}
		conn := t.cur.Load()
		if conn == nil {
			t.dropped.Add(1)
			continue
		}
		src, _, ok := ipv4Addrs(buf[:n])
		if !ok || src != addrU32(conn.ControlAddress()) {
			t.dropped.Add(1)
			continue
		}
		if err := conn.WritePacket(buf[:n]); err != nil {
			t.dropped.Add(1)
			continue
		}
		t.sent.Add(1)
	}
}
