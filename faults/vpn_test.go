package faults

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/sim"
	"code.foss.global/serve.zone/relay/vpnhub"
	"code.foss.global/serve.zone/relay/vpnhub/client"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// TestFaultVPNHandshakeFlood: bogus initiations — real QUIC and Noise dials with keys that are
// not members — arrive from 1 000 source addresses (short: 200) while two members exchange
// packets through the hub. The attacker is a process of its own (this test binary run again as
// the flooder), as it would be another machine: in the hub's process its dials' TLS work would
// compete with the hub's goroutines inside the hub's share of the CPU, which measures the Go
// scheduler, not the hub's bound on handshakes. It checks what the flood must never do: admit a bogus key, displace a
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
		flood, err := startFlooder(hub.Addr(), key.Public, sources)
		if err != nil {
			t.Fatal(err)
		}
		defer flood.stop()
		// The flood is on once every source has dialled; a starved machine may take long to get
		// there, which is no fault of the hub's.
		if err := flood.started(floodHang); err != nil {
			t.Fatalf("the flood did not start: %v", err)
		}
		during := exchange(members, total, flowPackets)
		counts, err := flood.stop()
		attempts, refused := counts.attempts, counts.refused
		if err != nil {
			t.Fatalf("the flooder: %v", err)
		}

		f.answered = during.received
		f.extra = fmt.Sprintf("members' loss %.2f %% during the flood (%.2f %% without); %d bogus dials, %d refused or cut "+
			"(%d judged at the Noise stage, %d refused at QUIC's first packet: rate-limited or busy)",
			during.lossPercent(), calm.lossPercent(), attempts, refused, counts.judged, counts.early)
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
		if attempts == 0 {
			t.Error("the flood made no handshake attempt")
		}
		if admitted := attempts - refused; admitted != 0 {
			t.Errorf("%d of %d bogus handshakes (keys no membership names) were admitted", admitted, attempts)
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
// a key no membership names, until stop is closed; dialled is called once, after its first dial
// (or when it cannot dial at all).
func bogusDials(hub netip.AddrPort, hubKey [32]byte, i int, stop <-chan struct{}, dialled func(), n *floodCounts) {
	once := sync.OnceFunc(dialled)
	defer once()
	src := netip.AddrFrom4([4]byte{127, 1, byte(i >> 8), byte(i)})
	pc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
	if err != nil {
		return
	}
	defer pc.Close()
	key, _ := vpnkey.Generate()
	cl, err := client.New(client.Config{Hub: hub, HubKey: hubKey, AuthorityID: sim.SimVPNAuthority,
		NodeID: fmt.Sprintf("bogus-%d", i), Key: key, Conn: plainSocket{pc}, HandshakeTimeout: time.Second, Logger: zerolog.Nop()})
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
		n.attempts.Add(1)
		var te *quic.TransportError
		switch {
		case err == nil:
		case errors.Is(err, contracts.VPNMemberUnknown):
			n.judged.Add(1)
		case errors.As(err, &te) && te.Remote && te.ErrorCode == quic.ConnectionRefused:
			n.early.Add(1)
		}
		if err != nil {
			n.refused.Add(1)
		} else {
			conn.Close() // does not happen: no membership names this key
		}
		once()
	}
}

// plainSocket hides a *net.UDPConn's type, so that the client gives quic-go the socket as it is
// instead of wrapping it in its batched one (about 1 MiB of buffers a socket: a thousand sources'
// worth would be the flooder's whole cost).
// It keeps the buffer sizes quic-go asks for (quic-go warns about a socket that cannot set them).
type plainSocket struct{ udp *net.UDPConn }

func (c plainSocket) ReadFrom(p []byte) (int, net.Addr, error)  { return c.udp.ReadFrom(p) }
func (c plainSocket) WriteTo(p []byte, a net.Addr) (int, error) { return c.udp.WriteTo(p, a) }
func (c plainSocket) Close() error                              { return c.udp.Close() }
func (c plainSocket) LocalAddr() net.Addr                       { return c.udp.LocalAddr() }
func (c plainSocket) SetDeadline(t time.Time) error             { return c.udp.SetDeadline(t) }
func (c plainSocket) SetReadDeadline(t time.Time) error         { return c.udp.SetReadDeadline(t) }
func (c plainSocket) SetWriteDeadline(t time.Time) error        { return c.udp.SetWriteDeadline(t) }
func (c plainSocket) SetReadBuffer(n int) error                 { return c.udp.SetReadBuffer(n) }
func (c plainSocket) SetWriteBuffer(n int) error                { return c.udp.SetWriteBuffer(n) }

// flooderEnv, when set, makes this test binary TestFaultVPNHandshakeFlood's flooder (TestMain):
// "hub address, hub key (hex), sources". It dials from every source until its standard input
// ends, writes "started" once every source has dialled, and at the end its counts.
const flooderEnv = "RELAY_FAULTS_VPN_FLOODER"

// flooder is the flooding process as the test sees it.
type flooder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
	done  bool
}

func startFlooder(hub netip.AddrPort, hubKey [32]byte, sources int) (*flooder, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %x %d", flooderEnv, hub, hubKey, sources))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &flooder{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}, nil
}

// started waits for the flooder's "started", up to hang (a bound for a hang).
func (f *flooder) started(hang time.Duration) error {
	got := make(chan error, 1)
	go func() {
		if !f.lines.Scan() || f.lines.Text() != "started" {
			got <- fmt.Errorf("the flooder wrote %q (%v)", f.lines.Text(), f.lines.Err())
			return
		}
		got <- nil
	}()
	select {
	case err := <-got:
		return err
	case <-time.After(hang):
		f.cmd.Process.Kill()
		<-got
		return fmt.Errorf("not every source dialled in %s", hang)
	}
}

// stop ends the flood and returns the flooder's counts. Later calls do nothing.
func (f *flooder) stop() (n floodTotals, err error) {
	if f.done {
		return n, nil
	}
	f.done = true
	f.stdin.Close()
	if f.lines.Scan() {
		_, err = fmt.Sscanf(f.lines.Text(), "%d %d %d %d", &n.attempts, &n.refused, &n.judged, &n.early)
	} else {
		err = fmt.Errorf("no counts (%v)", f.lines.Err())
	}
	if werr := f.cmd.Wait(); err == nil && werr != nil {
		err = werr
	}
	return n, err
}

// floodCounts are the flooder's dials: all of them; those that failed; of those, the ones the
// hub judged at the Noise stage (vpn-member-unknown) and the ones it refused at QUIC's first
// packet (CONNECTION_REFUSED: rate-limited or busy). The rest of the failed were cut by the
// dial's timeout.
type floodCounts struct{ attempts, refused, judged, early atomic.Int64 }

// floodTotals are floodCounts as the flooder reported them.
type floodTotals struct{ attempts, refused, judged, early int64 }

// flooderMain is the flooder process: bogusDials from every source until standard input ends.
func flooderMain() int {
	var hub, hexKey string
	var sources int
	if _, err := fmt.Sscanf(os.Getenv(flooderEnv), "%s %s %d", &hub, &hexKey, &sources); err != nil {
		fmt.Fprintln(os.Stderr, "flooder:", err)
		return 2
	}
	addr, err := netip.ParseAddrPort(hub)
	key, kerr := hex.DecodeString(hexKey)
	if err != nil || kerr != nil || len(key) != 32 {
		fmt.Fprintln(os.Stderr, "flooder: bad hub", hub, hexKey)
		return 2
	}
	var n floodCounts
	var dialled sync.WaitGroup
	stop := make(chan struct{})
	var flood sync.WaitGroup
	dialled.Add(sources)
	for i := range sources {
		flood.Go(func() { bogusDials(addr, [32]byte(key), i, stop, dialled.Done, &n) })
	}
	dialled.Wait()
	fmt.Println("started")
	io.Copy(io.Discard, os.Stdin) // until the test closes it
	close(stop)
	flood.Wait()
	fmt.Println(n.attempts.Load(), n.refused.Load(), n.judged.Load(), n.early.Load())
	return 0
}
