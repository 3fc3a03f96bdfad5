package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"code.foss.global/serve.zone/relay/vpnhub/client"
	"code.foss.global/serve.zone/relay/vpnhub/quicsock"
)

// The quic-go floor ("quicfwd"): the same hub-and-spoke carried in QUIC DATAGRAMs on the same
// socket (vpnhub/quicsock) with the same goroutines as our hub and client, but without Noise,
// handshake, membership or checks: the hub learns a client's inner address from its first
// datagram and forwards each datagram to the client at its destination. What our hub costs above
// this is the VPN's own work; what this costs above udpfwd is quic-go's.

const quicfwdALPN = "vpnhub-bench-quicfwd"

func selfSigned() *tls.Config {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: priv}}, NextProtos: []string{quicfwdALPN}}
}

// roleQUICForwarder serves the floor's hub until SIGTERM.
func roleQUICForwarder(args []string) {
	fs := flag.NewFlagSet("quicfwd-hub", flag.ExitOnError)
	listen := fs.String("listen", "", "host:port")
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
	sock, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(*listen)))
	if err != nil {
		fatal(err)
	}
	qs := quicsock.New(sock)
	tr := &quic.Transport{Conn: qs}
	ln, err := tr.Listen(selfSigned(), &quic.Config{EnableDatagrams: true, InitialPacketSize: quicPacketSize, MaxIdleTimeout: 30 * time.Second})
	if err != nil {
		fatal(err)
	}
	ctx, stop := signalContext()
	defer stop()
	var mu sync.RWMutex
	routes := map[[4]byte]chan []byte{}
	for {
		qc, err := ln.Accept(ctx)
		if err != nil {
			break
		}
		queue := make(chan []byte, 1024)
		go func() { // send loop
			for {
				select {
				case d := <-queue:
					if qc.SendDatagram(d) != nil {
						return
					}
				case <-qc.Context().Done():
					return
				}
			}
		}()
		go func() { // receive loop
			ap, _ := netip.ParseAddrPort(qc.RemoteAddr().String())
			flow := qs.Flow(ap)
			defer flow.Close()
			learned := false
			for {
				d, err := qc.ReceiveDatagram(qc.Context())
				if err != nil {
					return
				}
				if len(d) >= 20 {
					if !learned {
						mu.Lock()
						routes[[4]byte(d[12:16])] = queue
						mu.Unlock()
						learned = true
					}
					mu.RLock()
					to := routes[[4]byte(d[16:20])]
					mu.RUnlock()
					if to != nil {
						select {
						case to <- d:
						default: // full: dropped
						}
					}
				}
				flow.Drained()
			}
		}()
	}
	tr.Close()
	qs.Close()
}

// roleQUICClient carries its TUN's packets as QUIC datagrams to the floor's hub and back.
func roleQUICClient(args []string) {
	fs := flag.NewFlagSet("quicfwd-client", flag.ExitOnError)
	hub := fs.String("hub", "", "hub address:port")
	addr := fs.String("addr", "", "address/prefix length")
	tunName := fs.String("tun", "bt0", "TUN name")
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
	prefix, hubAt := netip.MustParsePrefix(*addr), netip.MustParseAddrPort(*hub)
	tun, err := client.OpenTUNOffload(*tunName)
	if err != nil {
		fatal(err)
	}
	sock, err := net.ListenUDP("udp4", &net.UDPAddr{})
	if err != nil {
		fatal(err)
	}
	qs := quicsock.New(sock)
	tr := &quic.Transport{Conn: qs}
	ctx, stop := signalContext()
	defer stop()
	var qc *quic.Conn
	for qc == nil && ctx.Err() == nil {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		qc, err = tr.Dial(dctx, net.UDPAddrFromAddrPort(hubAt), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{quicfwdALPN}},
			&quic.Config{EnableDatagrams: true, InitialPacketSize: quicPacketSize, MaxIdleTimeout: 30 * time.Second, KeepAlivePeriod: 10 * time.Second})
		cancel()
	}
	if qc == nil {
		return
	}
	var tooLarge *quic.DatagramTooLargeError
	if err := qc.SendDatagram(make([]byte, 1<<14)); !errors.As(err, &tooLarge) {
		fatal(fmt.Errorf("probe: %v", err))
	}
	mtu := int(tooLarge.MaxDatagramPayloadSize)
	if err := tun.Configure(prefix, mtu); err != nil {
		fatal(err)
	}
	self := prefix.Addr().As4()
	hello := make([]byte, 20) // teaches the hub this client's inner address
	copy(hello[12:16], self[:])
	qc.SendDatagram(hello)
	fmt.Fprintf(os.Stderr, "joined as %s, mtu %d\n", prefix.Addr(), mtu)

	flow := qs.Flow(hubAt)
	inbox := make(chan []byte, 1024)
	go func() { // drain loop
		defer close(inbox)
		for {
			d, err := qc.ReceiveDatagram(context.Background())
			if err != nil {
				return
			}
			select {
			case inbox <- d:
			default:
			}
			flow.Drained()
		}
	}()
	go func() { // to the TUN, a burst at a time
		const offset = 16
		bufs := make([][]byte, 64)
		for i := range bufs {
			bufs[i] = make([]byte, offset+65535)
		}
		for d := range inbox {
			n := 0
			for {
				bufs[n] = append(bufs[n][:offset], d...)
				n++
				if n == len(bufs) {
					break
				}
				select {
				case d = <-inbox:
					if d != nil {
						continue
					}
				default:
				}
				break
			}
			tun.Write(bufs[:n], offset)
		}
	}()
	go func() { // from the TUN
		const offset = 16
		bufs, sizes := make([][]byte, tun.BatchSize()), make([]int, tun.BatchSize())
		for i := range bufs {
			bufs[i] = make([]byte, offset+65535)
		}
		for {
			n, err := tun.Read(bufs, sizes, offset)
			if err != nil {
				return
			}
			for i := range n {
				qc.SendDatagram(bufs[i][offset : offset+sizes[i]])
			}
		}
	}()
	<-ctx.Done()
	qc.CloseWithError(0, "")
	tun.Close()
	tr.Close()
	qs.Close()
}
