package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub"
	"code.foss.global/serve.zone/relay/vpnhub/client"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// The processes the orchestrator starts inside the namespaces, one role each: our hub and client,
// and the plain UDP forwarder and its client. Each runs until SIGTERM.

// quicPacketSize fills a 1500-byte veth: 1500 - 20 (IPv4) - 8 (UDP).
const quicPacketSize = 1472

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}

func logger() zerolog.Logger {
	return zerolog.New(os.Stderr).Level(zerolog.WarnLevel).With().Timestamp().Logger()
}

func readKey(path string) vpnkey.Pair {
	k, err := vpnkey.LoadFile(path, logger())
	if err != nil {
		fatal(err)
	}
	return k
}

// roleHub serves our hub with a membership read from a file.
func roleHub(args []string) {
	fs := flag.NewFlagSet("hub", flag.ExitOnError)
	listen := fs.String("listen", "", "host:port")
	keyFile := fs.String("key", "", "hub key file")
	members := fs.String("members", "", "pushClusterVpnMembership body")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile here")
	traceDrops := fs.Bool("quic-drops", false, "count quic-go's own drops (slow)")
	fs.Parse(args)
	drops := newQUICDrops()
	var tracer = drops.tracer
	if !*traceDrops {
		tracer = nil
	}
	reg := prometheus.NewRegistry()
	h, err := vpnhub.Listen(vpnhub.Config{Listen: *listen, Key: readKey(*keyFile), InitialPacketSize: quicPacketSize, QUICTracer: tracer},
		vpnhub.Options{Logger: logger(), Registerer: reg})
	if err != nil {
		fatal(err)
	}
	defer func() {
		if *traceDrops {
			fmt.Println(drops)
		}
	}()
	body, err := os.ReadFile(*members)
	if err != nil {
		fatal(err)
	}
	if _, err := h.PushMembership(body); err != nil {
		fatal(err)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	ctx, stop := signalContext()
	defer stop()
	if err := h.Run(ctx); err != nil {
		fatal(err)
	}
	mfs, _ := reg.Gather()
	counts := map[string]float64{}
	for _, mf := range mfs {
		for _, x := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range x.GetLabel() {
				name += "{" + l.GetValue() + "}"
			}
			if c := x.GetCounter(); c != nil && c.GetValue() > 0 {
				counts[name] = c.GetValue()
			}
		}
	}
	json.NewEncoder(os.Stdout).Encode(counts)
}

// roleClient runs our client with a TUN in the current namespace.
func roleClient(args []string) {
	fs := flag.NewFlagSet("client", flag.ExitOnError)
	hub := fs.String("hub", "", "hub address:port")
	hubKey := fs.String("hub-key", "", "hub public key (base64url)")
	keyFile := fs.String("key", "", "member key file")
	node := fs.String("node", "", "node id")
	authority := fs.String("authority", "", "authority id")
	addr := fs.String("addr", "", "control address/prefix length")
	tunName := fs.String("tun", "bt0", "TUN name")
	traceDrops := fs.Bool("quic-drops", false, "count quic-go's own drops (slow)")
	offload := fs.Bool("offload", true, "TUN with TCP segmentation and coalescing offloads")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile here")
	fs.Parse(args)
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fatal(err)
		}
		pprof.StartCPUProfile(f)
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	drops := newQUICDrops()
	var tracer = drops.tracer
	if !*traceDrops {
		tracer = nil
	}
	hk, err := contracts.DecodeKey32(*hubKey)
	if err != nil {
		fatal(err)
	}
	prefix := netip.MustParsePrefix(*addr)
	open := client.OpenTUN
	if *offload {
		open = client.OpenTUNOffload
	}
	tun, err := open(*tunName)
	if err != nil {
		fatal(err)
	}
	cl, err := client.New(client.Config{Hub: netip.MustParseAddrPort(*hub), HubKey: hk, AuthorityID: *authority,
		NodeID: *node, Key: readKey(*keyFile), InitialPacketSize: quicPacketSize, Logger: logger(), QUICTracer: tracer})
	if err != nil {
		fatal(err)
	}
	var once sync.Once
	tu := &client.Tunnel{Client: cl, Device: tun, Logger: logger(), OnJoin: func(c *client.Conn) {
		once.Do(func() {
			if err := tun.Configure(prefix, c.MTU()); err != nil {
				fatal(err)
			}
			fmt.Fprintf(os.Stderr, "joined as %s, mtu %d\n", c.ControlAddress(), c.MTU())
		})
	}}
	ctx, stop := signalContext()
	defer stop()
	tu.Run(ctx)
	cl.Close()
	txDropped, _ := os.ReadFile("/sys/class/net/" + *tunName + "/statistics/tx_dropped")
	fmt.Printf("{\"sent\":%d,\"received\":%d,\"dropped\":%d,\"tunTxDropped\":%s}\n", tu.Sent(), tu.Received(), tu.Dropped(), strings.TrimSpace(string(txDropped)))
	if *traceDrops {
		fmt.Println(drops)
	}
}

// roleUDPForwarder is the physical reference: every UDP datagram is one raw IP packet, forwarded to
// the client that last sent from the packet's destination address. No crypto, no QUIC.
func roleUDPForwarder(args []string) {
	fs := flag.NewFlagSet("udpfwd-hub", flag.ExitOnError)
	listen := fs.String("listen", "", "host:port")
	fs.Parse(args)
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(*listen)))
	if err != nil {
		fatal(err)
	}
	c.SetReadBuffer(4 << 20)
	c.SetWriteBuffer(4 << 20)
	ctx, stop := signalContext()
	defer stop()
	go func() { <-ctx.Done(); c.Close() }()
	var mu sync.RWMutex
	table := map[[4]byte]netip.AddrPort{}
	buf := make([]byte, 65536)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) // a udp4 socket cannot send to ::ffff:a.b.c.d
		p := buf[:n]
		if n == 4 { // hello: the client's inner address
			mu.Lock()
			table[[4]byte(p)] = from
			mu.Unlock()
			continue
		}
		if n < 20 {
			continue
		}
		mu.RLock()
		to, ok := table[[4]byte(p[16:20])]
		mu.RUnlock()
		if ok {
			c.WriteToUDPAddrPort(p, to)
		}
	}
}

// roleUDPClient carries its TUN's packets raw in UDP to the forwarder and back.
func roleUDPClient(args []string) {
	fs := flag.NewFlagSet("udpfwd-client", flag.ExitOnError)
	hub := fs.String("hub", "", "forwarder address:port")
	addr := fs.String("addr", "", "address/prefix length")
	tunName := fs.String("tun", "bt0", "TUN name")
	mtu := fs.Int("mtu", 1472, "TUN mtu: the largest packet one UDP datagram carries on the 1500-byte veth")
	fs.Parse(args)
	prefix := netip.MustParsePrefix(*addr)
	tun, err := client.OpenTUN(*tunName)
	if err != nil {
		fatal(err)
	}
	if err := tun.Configure(prefix, *mtu); err != nil {
		fatal(err)
	}
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(*hub)))
	if err != nil {
		fatal(err)
	}
	c.SetReadBuffer(4 << 20)
	c.SetWriteBuffer(4 << 20)
	self := prefix.Addr().As4()
	ctx, stop := signalContext()
	defer stop()
	go func() {
		hello := self[:]
		for ctx.Err() == nil {
			c.Write(hello)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	go func() {
		bufs, sizes := [][]byte{make([]byte, 65536)}, []int{0}
		for {
			if _, err := tun.Read(bufs, sizes, 0); err != nil {
				return
			}
			c.Write(bufs[0][:sizes[0]])
		}
	}()
	go func() {
		buf := make([]byte, 65536)
		for {
			n, err := c.Read(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				continue // ECONNREFUSED from an ICMP error before the forwarder was up
			}
			if n >= 20 {
				tun.Write([][]byte{buf[:n]}, 0)
			}
		}
	}()
	<-ctx.Done()
	tun.Close()
	c.Close()
}
