package faults

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/sim"
	"code.foss.global/serve.zone/relay/vpnhub"
	"code.foss.global/serve.zone/relay/vpnhub/client"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// TestFaultVPNHandshakeFlood: bogus initiations — real QUIC and Noise dials with keys that are
// not members — arrive from 1 000 source addresses (short: 200) while two members exchange
// packets through the hub. It checks what the flood must never do: admit a bogus key, displace a
// member's session, or stop the members' packets. "Never stop" is observed, not timed: the flood
// lasts at least its planned length and on until each member has received flowPackets from the
// other while it runs, however long a starved machine takes to carry them (up to floodHang).
// The members' packet loss during the flood, against the same exchange just before it, is a
// figure (go run ./bench -suites faults): on a busy machine the loss measures the machine as much
// as the hub, so no test judges it.
func TestFaultVPNHandshakeFlood(t *testing.T) {
	base := runtime.NumGoroutine()
	sources, total := size(200, 1000), size(3*time.Second, 20*time.Second)
	f := figures{fault: fmt.Sprintf("VPN handshake flood from %d sources for %s", sources, total), nodes: 2}
	func() {
		key, err := vpnkey.Generate()
		if err != nil {
			t.Fatal(err)
		}
		hub, err := vpnhub.Listen(vpnhub.Config{Listen: "127.0.0.1:0", Key: key}, vpnhub.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		hubDone := make(chan error, 1)
		go func() { hubDone <- hub.Run(ctx) }()
		defer func() { cancel(); <-hubDone }()

		members, err := sim.NewVPNNodes(sim.SimVPNControlPrefix, zerolog.Nop(), "node-a", "node-b")
		if err != nil {
			t.Fatal(err)
		}
		body := sim.VPNMembershipBody(sim.SimVPNAuthority, sim.SimVPNControlPrefix, 1, time.Now().Add(time.Hour).UnixMilli(), members)
		if _, err := hub.PushMembership(body); err != nil {
			t.Fatal(err)
		}
		for _, m := range members {
			jctx, jcancel := context.WithTimeout(ctx, 10*time.Second)
			err := m.Join(jctx, hub.Addr(), key.Public, sim.SimVPNAuthority)
			jcancel()
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
		}

		calm := exchange(members, total/2, 0)
		var attempts, refused atomic.Int64
		stop := make(chan struct{})
		var flood sync.WaitGroup
		stopFlood := sync.OnceFunc(func() { close(stop); flood.Wait() })
		defer stopFlood()
		for i := range sources {
			flood.Add(1)
			go func() {
				defer flood.Done()
				bogusDials(hub.Addr(), key.Public, i, stop, &attempts, &refused)
			}()
		}
		// The flood is on once every source has dialled; a starved machine may take long to get
		// there, which is no fault of the hub's.
		if !await.Within(floodHang, func() bool { return attempts.Load() >= int64(sources) }) {
			t.Fatalf("the flood did not start: %d dials from %d sources in %s", attempts.Load(), sources, floodHang)
		}
		during := exchange(members, total, flowPackets)
		stopFlood()

		f.answered = during.received
		f.extra = fmt.Sprintf("members' loss %.2f %% during the flood (%.2f %% without); %d bogus dials, %d refused or cut",
			during.lossPercent(), calm.lossPercent(), attempts.Load(), refused.Load())
		if short := during.short(flowPackets); short != "" {
			t.Errorf("the members' packets stopped during the flood: %s in %s", short, during.took)
		}
		for _, m := range members {
			if err := m.Err(); err != nil {
				t.Errorf("member %s lost its session to the flood: %v", m.ID, err)
			}
		}
		if after := exchange(members, 0, 1); after.short(1) != "" {
			t.Errorf("the members' packets did not flow after the flood: %s in %s", after.short(1), after.took)
		}
		if attempts.Load() == 0 {
			t.Error("the flood made no handshake attempt")
		}
		if admitted := attempts.Load() - refused.Load(); admitted != 0 {
			t.Errorf("%d of %d bogus handshakes (keys no membership names) were admitted", admitted, attempts.Load())
		}
	}()
	f.leaked = leakedAfter(t, base)
	f.check(t)
}

// flowPackets is how many packets each member must receive from the other while the flood runs;
// floodHang bounds every wait on the flood and the members, for a hang, not for a busy machine.
const (
	flowPackets = 20
	floodHang   = 2 * time.Minute
)

type exchanged struct {
	sent, received int64
	each           [2]int64 // received by members[0] and members[1]
	took           time.Duration
}

func (e exchanged) lossPercent() float64 {
	if e.sent == 0 {
		return 0
	}
	return 100 * float64(e.sent-e.received) / float64(e.sent)
}

// short says which member received fewer than want packets, or "" if neither did.
func (e exchanged) short(want int64) string {
	if e.each[0] >= want && e.each[1] >= want {
		return ""
	}
	return fmt.Sprintf("members received %d and %d packets of the %d wanted each (%d sent)", e.each[0], e.each[1], want, e.sent)
}

// exchange has each member send 200 packets a second to the other for at least d and on until
// each has received want packets from the other (or floodHang has passed, or a member's session
// ended), and counts what arrives.
func exchange(members []*sim.VPNNode, d time.Duration, want int64) exchanged {
	start := time.Now()
	before := [2]int64{members[0].Received(), members[1].Received()}
	each := func() [2]int64 { return [2]int64{members[0].Received() - before[0], members[1].Received() - before[1]} }
	flowed := func() bool { e := each(); return e[0] >= want && e[1] >= want }
	var sent int64
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for ; time.Since(start) < d || !flowed() && time.Since(start) < floodHang; <-tick.C {
		n0, err0 := members[0].Send(members[1], 2, 200)
		n1, err1 := members[1].Send(members[0], 2, 200)
		sent += int64(n0 + n1)
		if err0 != nil || err1 != nil {
			break // a session ended: the caller reports it
		}
	}
	received := func() int64 { e := each(); return e[0] + e[1] }
	// The last packets in flight: all of them, or what has come when the window for them closes
	// (the rest is the loss this measures).
	await.Within(300*time.Millisecond, func() bool { return received() >= sent })
	return exchanged{sent: sent, received: received(), each: each(), took: time.Since(start).Round(time.Millisecond)}
}

// bogusDials dials the hub again and again from its own loopback source address (127.1.x.y) with
// a key no membership names, until stop is closed.
func bogusDials(hub netip.AddrPort, hubKey [32]byte, i int, stop <-chan struct{}, attempts, refused *atomic.Int64) {
	src := netip.AddrFrom4([4]byte{127, 1, byte(i >> 8), byte(i)})
	pc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
	if err != nil {
		return
	}
	defer pc.Close()
	key, _ := vpnkey.Generate()
	cl, err := client.New(client.Config{Hub: hub, HubKey: hubKey, AuthorityID: sim.SimVPNAuthority,
		NodeID: fmt.Sprintf("bogus-%d", i), Key: key, Conn: pc, HandshakeTimeout: time.Second, Logger: zerolog.Nop()})
	if err != nil {
		return
	}
	defer cl.Close()
	for {
		select {
		case <-stop:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := cl.Dial(ctx)
		cancel()
		attempts.Add(1)
		if err != nil {
			refused.Add(1)
		} else {
			conn.Close() // does not happen: no membership names this key
		}
	}
}
