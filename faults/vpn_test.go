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
// member's session, or stop the members' packets. The members' packet loss during the flood,
// against the same exchange just before it, is a figure (go run ./bench -suites faults): on a
// busy machine the loss measures the machine as much as the hub, so no test judges it.
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

		calm := exchange(members, total/2)
		var attempts, refused atomic.Int64
		stop := make(chan struct{})
		var flood sync.WaitGroup
		for i := range sources {
			flood.Add(1)
			go func() {
				defer flood.Done()
				bogusDials(hub.Addr(), key.Public, i, stop, &attempts, &refused)
			}()
		}
		await.Within(5*time.Second, func() bool { return attempts.Load() >= int64(sources) }) // the flood is on: every source has dialled
		during := exchange(members, total)
		close(stop)
		flood.Wait()

		f.answered = during.received
		f.extra = fmt.Sprintf("members' loss %.2f %% during the flood (%.2f %% without); %d bogus dials, %d refused or cut",
			during.lossPercent(), calm.lossPercent(), attempts.Load(), refused.Load())
		if during.received == 0 {
			t.Error("no member packet arrived during the flood")
		}
		for _, m := range members {
			if err := m.Err(); err != nil {
				t.Errorf("member %s lost its session to the flood: %v", m.ID, err)
			}
		}
		if after := exchange(members, 100*time.Millisecond); after.received == 0 {
			t.Error("no member packet arrived after the flood")
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

type exchanged struct{ sent, received int64 }

func (e exchanged) lossPercent() float64 {
	if e.sent == 0 {
		return 0
	}
	return 100 * float64(e.sent-e.received) / float64(e.sent)
}

// exchange has each member send 200 packets a second to the other for d and counts what arrives.
func exchange(members []*sim.VPNNode, d time.Duration) exchanged {
	before := members[0].Received() + members[1].Received()
	var sent int64
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(d); time.Now().Before(end); <-tick.C {
		n0, _ := members[0].Send(members[1], 2, 200)
		n1, _ := members[1].Send(members[0], 2, 200)
		sent += int64(n0 + n1)
	}
	received := func() int64 { return members[0].Received() + members[1].Received() - before }
	// The last packets in flight: all of them, or what has come when the window for them closes
	// (the rest is the loss this measures).
	await.Within(300*time.Millisecond, func() bool { return received() >= sent })
	return exchanged{sent: sent, received: received()}
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
