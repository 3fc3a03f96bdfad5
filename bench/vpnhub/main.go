// Command vpnhub is the VPN hub benchmark (README.md#measuring-it): TCP throughput with iperf3 and
// packets per second between two network namespaces whose only path is a hub in a third, through
// hubs measured in the same run —
//
//   - vpnhub:     our hub and client (QUIC DATAGRAM + Noise), a TUN on each side;
//   - wireguard:  wireguard-go as the same hub-and-spoke (a TUN on each side and one at the hub,
//     the hub's kernel routing between its peers);
//   - udpfwd:     a plain UDP forwarder and a TUN client without crypto, the physical reference;
//   - quicfwd:    the same in QUIC DATAGRAMs on our socket, without Noise: quic-go's own floor
//     (quicfwd.go).
//
// It needs root, iproute2, iperf3, wireguard-tools and a wireguard-go binary; run.sh installs them
// and runs it. It is not part of CI. Usage (as root):
//
//	vpnhub run [-duration 10s] [-repeat 3] [-wireguard /tmp/wgbin/wireguard] [-only vpnhub,wireguard,udpfwd,quicfwd] [-cpuprofile dir]
//
// The other subcommands (hub, client, udpfwd-hub, udpfwd-client) are the processes it starts
// inside the namespaces.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: vpnhub run|hub|client|udpfwd-hub|udpfwd-client|quicfwd-hub|quicfwd-client [flags]")
		os.Exit(2)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "run":
		orchestrate(args)
	case "hub":
		roleHub(args)
	case "client":
		roleClient(args)
	case "udpfwd-hub":
		roleUDPForwarder(args)
	case "udpfwd-client":
		roleUDPClient(args)
	case "quicfwd-hub":
		roleQUICForwarder(args)
	case "quicfwd-client":
		roleQUICClient(args)
	default:
		fmt.Fprintf(os.Stderr, "unknown subcommand %q\n", os.Args[1])
		os.Exit(2)
	}
}

// atExit runs before fatal exits (the orchestrator removes its namespaces there).
var atExit func()

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "vpnhub bench:", err)
	if atExit != nil {
		atExit()
	}
	os.Exit(1)
}
