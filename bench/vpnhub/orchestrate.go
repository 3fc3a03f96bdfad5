package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/vpnhub/vpnkey"
)

// The orchestrator: three namespaces (hub, a, b) joined by 1500-byte veth pairs, the hub's
// underlay address on its loopback; each setup starts its processes, waits until a and b ping each
// other through their TUNs, runs iperf3, and stops them. Rounds interleave the setups so that a
// change in the machine's background load touches all of them alike.

const (
	nsHub, nsA, nsB = "vpnbench-hub", "vpnbench-a", "vpnbench-b"
	underlayHub     = "10.201.0.1"
	tunPrefix       = "10.77.0.0/24"
	tunA, tunB      = "10.77.0.2", "10.77.0.3"
	authority       = "bench-authority"
)

type proc struct {
	name string
	cmd  *exec.Cmd
	out  *bytes.Buffer
}

type setup struct {
	name  string
	procs []*proc
}

type measure struct {
	samples  []sample
	mtu      int
	hubStats string
}

func orchestrate(args []string) {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	duration := fs.Duration("duration", 10*time.Second, "iperf3 TCP duration per run")
	repeat := fs.Int("repeat", 3, "rounds; each runs every setup once")
	wgPath := fs.String("wireguard", "/tmp/wgbin/wireguard", "the wireguard-go binary")
	only := fs.String("only", "vpnhub,wireguard,udpfwd,quicfwd", "setups to run")
	profDir := fs.String("cpuprofile", "", "write our hub's and clients' CPU profiles of each round here")
	udp := fs.Bool("udp", true, "measure UDP packets per second in every round")
	quicDrops := fs.Bool("quic-drops", false, "have our hub and clients count quic-go's own drops (slows them)")
	fs.Parse(args)
	if os.Geteuid() != 0 {
		fatal(fmt.Errorf("needs root (network namespaces, TUN)"))
	}
	for _, tool := range []string{"ip", "iperf3", "wg"} {
		if _, err := exec.LookPath(tool); err != nil {
			fatal(fmt.Errorf("%s not installed (Debian: iproute2, iperf3, wireguard-tools)", tool))
		}
	}
	self, err := os.Executable()
	if err != nil {
		fatal(err)
	}
	dir, err := os.MkdirTemp("", "vpnhub-bench-")
	if err != nil {
		fatal(err)
	}
	defer os.RemoveAll(dir)
	teardown()
	defer teardown()
	atExit = teardown
	network()

	names := strings.Split(*only, ",")
	results := map[string]*measure{}
	for _, n := range names {
		results[n] = &measure{}
	}
	for round := 1; round <= *repeat; round++ {
		for _, n := range names {
			m := results[n]
			s := start(n, self, *wgPath, dir, round, *profDir, *quicDrops, m)
			if err := waitReady(); err != nil {
				stop(s)
				dumpLogs(s)
				fatal(fmt.Errorf("%s: %w", n, err))
			}
			r := measureRound(s, *duration, *udp)
			stop(s)
			m.samples = append(m.samples, r)
			if n == "vpnhub" {
				m.hubStats = strings.TrimSpace(s.procs[0].out.String())
				for _, p := range s.procs[1:] {
					fmt.Fprintf(os.Stderr, "  %s: %s\n", p.name, strings.TrimSpace(p.out.String()))
				}
				fmt.Fprintf(os.Stderr, "  hub: %s\n", m.hubStats)
			}
			fmt.Fprintf(os.Stderr, "round %d %-9s tcp %7.1f Mbit/s retrans %6.0f hub %5.2f µs/pkt (%.1fs, %.0f pkts) spokes %.1fs | udp %6.0f/%6.0f pkts/s hub %5.2f µs/pkt | rcvbuf errors %v\n",
				round, n, r.tcpMbps, r.retrans, r.hubCPUPerPacket(), r.tcpHubCPU, r.tcpPackets, r.tcpSpokesCPU, r.udpPPS, r.udpSent, r.udpCPUPerPacket(), r.rcvbufErrs)
		}
	}
	report(names, results, *duration, *repeat)
}

func run(args ...string) {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		fatal(fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out))
	}
}

func output(args ...string) string {
	out, err := exec.Command(args[0], args[1:]...).Output()
	if err != nil {
		fatal(fmt.Errorf("%s: %v", strings.Join(args, " "), err))
	}
	return strings.TrimSpace(string(out))
}

func teardown() {
	for _, ns := range []string{nsHub, nsA, nsB} {
		exec.Command("ip", "netns", "del", ns).Run()
	}
}

func network() {
	for _, ns := range []string{nsHub, nsA, nsB} {
		run("ip", "netns", "add", ns)
		run("ip", "-n", ns, "link", "set", "lo", "up")
	}
	run("ip", "-n", nsHub, "addr", "add", underlayHub+"/32", "dev", "lo")
	for i, ns := range []string{nsA, nsB} {
		h, n := fmt.Sprintf("vbh%d", i), fmt.Sprintf("vbn%d", i)
		run("ip", "link", "add", h, "netns", nsHub, "mtu", "1500", "type", "veth", "peer", "name", n, "netns", ns, "mtu", "1500")
		run("ip", "-n", nsHub, "addr", "add", fmt.Sprintf("10.201.%d.1/30", i+1), "dev", h)
		run("ip", "-n", ns, "addr", "add", fmt.Sprintf("10.201.%d.2/30", i+1), "dev", n)
		run("ip", "-n", nsHub, "link", "set", h, "up")
		run("ip", "-n", ns, "link", "set", n, "up")
		run("ip", "-n", ns, "route", "add", "default", "via", fmt.Sprintf("10.201.%d.1", i+1))
	}
}

func spawn(name, ns string, env []string, args ...string) *proc {
	p := &proc{name: name, out: &bytes.Buffer{}}
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	p.cmd.Env = append(os.Environ(), env...)
	if err := p.cmd.Start(); err != nil {
		fatal(fmt.Errorf("start %s: %w", name, err))
	}
	return p
}

func start(name, self, wgPath, dir string, round int, profDir string, quicDrops bool, m *measure) *setup {
	s := &setup{name: name}
	switch name {
	case "udpfwd":
		s.procs = []*proc{spawn("udpfwd-hub", nsHub, nil, self, "udpfwd-hub", "-listen", underlayHub+":5555")}
		time.Sleep(200 * time.Millisecond)
		for _, c := range []struct{ ns, addr string }{{nsA, tunA}, {nsB, tunB}} {
			s.procs = append(s.procs, spawn("udpfwd-client", c.ns, nil, self, "udpfwd-client", "-hub", underlayHub+":5555", "-addr", c.addr+"/24"))
		}
		m.mtu = 1472
	case "quicfwd":
		args := []string{self, "quicfwd-hub", "-listen", underlayHub + ":5556"}
		if profDir != "" {
			args = append(args, "-cpuprofile", filepath.Join(profDir, fmt.Sprintf("quicfwd-hub-round%d.pprof", round)))
		}
		s.procs = []*proc{spawn("quicfwd-hub", nsHub, nil, args...)}
		time.Sleep(200 * time.Millisecond)
		for _, c := range []struct{ ns, addr string }{{nsA, tunA}, {nsB, tunB}} {
			args := []string{self, "quicfwd-client", "-hub", underlayHub + ":5556", "-addr", c.addr + "/24"}
			if profDir != "" {
				args = append(args, "-cpuprofile", filepath.Join(profDir, fmt.Sprintf("quicfwd-%s-round%d.pprof", c.addr, round)))
			}
			s.procs = append(s.procs, spawn("quicfwd-client", c.ns, nil, args...))
		}
	case "vpnhub":
		hubKey := keyFile(dir, "hub.key")
		ka, kb := keyFile(dir, "a.key"), keyFile(dir, "b.key")
		members := filepath.Join(dir, "members.json")
		exp := time.Now().Add(24 * time.Hour).UnixMilli()
		body := contracts.EncodeVPNMembershipPush(contracts.VPNMembership{AuthorityID: authority,
			ControlPrefix: netip.MustParsePrefix(tunPrefix), Generation: 1, Members: []contracts.VPNMember{
				{NodeID: "node-a", PublicKey: ka.Public, ControlAddress: netip.MustParseAddr(tunA), ExpiresAt: exp},
				{NodeID: "node-b", PublicKey: kb.Public, ControlAddress: netip.MustParseAddr(tunB), ExpiresAt: exp}}})
		os.WriteFile(members, body, 0o600)
		hubArgs := []string{self, "hub", "-listen", underlayHub + ":4433", "-key", filepath.Join(dir, "hub.key"), "-members", members}
		if profDir != "" {
			hubArgs = append(hubArgs, "-cpuprofile", filepath.Join(profDir, fmt.Sprintf("vpnhub-hub-round%d.pprof", round)))
		}
		var extra []string
		if quicDrops {
			hubArgs = append(hubArgs, "-quic-drops")
			extra = []string{"-quic-drops"}
		}
		s.procs = []*proc{spawn("vpnhub-hub", nsHub, nil, hubArgs...)}
		time.Sleep(200 * time.Millisecond)
		for _, c := range []struct{ ns, node, key, addr string }{{nsA, "node-a", "a.key", tunA}, {nsB, "node-b", "b.key", tunB}} {
			args := append([]string{self, "client", "-hub", underlayHub + ":4433",
				"-hub-key", contracts.EncodeKey32(hubKey.Public), "-key", filepath.Join(dir, c.key), "-node", c.node,
				"-authority", authority, "-addr", c.addr + "/24"}, extra...)
			if profDir != "" {
				args = append(args, "-cpuprofile", filepath.Join(profDir, fmt.Sprintf("vpnhub-%s-round%d.pprof", c.node, round)))
			}
			s.procs = append(s.procs, spawn("vpnhub-client", c.ns, nil, args...))
		}
	case "wireguard":
		env := []string{"WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD=1"}
		keys := map[string]string{}
		for _, k := range []string{"h", "a", "b"} {
			priv := output("wg", "genkey")
			os.WriteFile(filepath.Join(dir, "wg-"+k), []byte(priv+"\n"), 0o600)
			cmd := exec.Command("wg", "pubkey")
			cmd.Stdin = strings.NewReader(priv)
			pub, err := cmd.Output()
			if err != nil {
				fatal(err)
			}
			keys[k] = strings.TrimSpace(string(pub))
		}
		s.procs = []*proc{spawn("wireguard-hub", nsHub, env, wgPath, "-f", "wgh")}
		for _, c := range []struct{ ns, dev string }{{nsA, "wga"}, {nsB, "wgb"}} {
			s.procs = append(s.procs, spawn("wireguard-spoke", c.ns, env, wgPath, "-f", c.dev))
		}
		waitSock("wgh", "wga", "wgb")
		run("ip", "netns", "exec", nsHub, "sysctl", "-qw", "net.ipv4.ip_forward=1")
		run("ip", "netns", "exec", nsHub, "sysctl", "-qw", "net.ipv4.conf.all.send_redirects=0")
		run("ip", "netns", "exec", nsHub, "wg", "set", "wgh", "private-key", filepath.Join(dir, "wg-h"), "listen-port", "51820",
			"peer", keys["a"], "allowed-ips", tunA+"/32", "peer", keys["b"], "allowed-ips", tunB+"/32")
		run("ip", "-n", nsHub, "addr", "add", "10.77.0.1/24", "dev", "wgh")
		run("ip", "-n", nsHub, "link", "set", "wgh", "mtu", "1420", "up")
		run("ip", "netns", "exec", nsHub, "sysctl", "-qw", "net.ipv4.conf.wgh.send_redirects=0")
		for _, c := range []struct{ ns, dev, key, addr string }{{nsA, "wga", "a", tunA}, {nsB, "wgb", "b", tunB}} {
			run("ip", "netns", "exec", c.ns, "wg", "set", c.dev, "private-key", filepath.Join(dir, "wg-"+c.key),
				"peer", keys["h"], "endpoint", underlayHub+":51820", "allowed-ips", tunPrefix, "persistent-keepalive", "25")
			run("ip", "-n", c.ns, "addr", "add", c.addr+"/24", "dev", c.dev)
			run("ip", "-n", c.ns, "link", "set", c.dev, "mtu", "1420", "up")
		}
		m.mtu = 1420
	default:
		fatal(fmt.Errorf("unknown setup %q", name))
	}
	return s
}

func keyFile(dir, name string) vpnkey.Pair {
	path := filepath.Join(dir, name)
	k, err := vpnkey.LoadOrCreateFile(path, logger())
	if err != nil {
		fatal(err)
	}
	return k
}

func waitSock(names ...string) {
	for _, n := range names {
		for i := 0; ; i++ {
			if _, err := os.Stat("/var/run/wireguard/" + n + ".sock"); err == nil {
				break
			}
			if i > 100 {
				fatal(fmt.Errorf("wireguard-go %s did not start", n))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func waitReady() error {
	for i := 0; i < 40; i++ {
		a := exec.Command("ip", "netns", "exec", nsA, "ping", "-c", "1", "-W", "1", tunB).Run()
		b := exec.Command("ip", "netns", "exec", nsB, "ping", "-c", "1", "-W", "1", tunA).Run()
		if a == nil && b == nil {
			return nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("a and b cannot ping each other")
}

// stop ends a setup's processes.
func stop(s *setup) {
	for _, p := range s.procs {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range s.procs {
		done := make(chan struct{})
		go func() { p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			p.cmd.Process.Kill()
			<-done
		}
	}
}

func dumpLogs(s *setup) {
	for _, p := range s.procs {
		fmt.Fprintf(os.Stderr, "--- %s\n%s\n", p.name, p.out)
	}
}

type iperfResult struct {
	End struct {
		SumReceived struct {
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
		SumSent struct {
			Retransmits float64 `json:"retransmits"`
		} `json:"sum_sent"`
		Sum struct {
			Packets     float64 `json:"packets"`
			LostPackets float64 `json:"lost_packets"`
			Seconds     float64 `json:"seconds"`
		} `json:"sum"`
	} `json:"end"`
	Error string `json:"error"`
}

func iperf(clientArgs ...string) iperfResult {
	srv := exec.Command("ip", "netns", "exec", nsB, "iperf3", "-s", "-1", "-p", "5201")
	srv.Start()
	defer func() {
		srv.Process.Signal(syscall.SIGTERM)
		srv.Wait()
	}()
	time.Sleep(300 * time.Millisecond)
	args := append([]string{"netns", "exec", nsA, "iperf3", "-c", tunB, "-p", "5201", "-J"}, clientArgs...)
	out, err := exec.Command("ip", args...).Output()
	var r iperfResult
	if jerr := json.Unmarshal(out, &r); jerr != nil || r.Error != "" {
		fatal(fmt.Errorf("iperf3 %v: %v %v %s", clientArgs, err, jerr, r.Error))
	}
	return r
}

func tcpRun(d time.Duration) (mbps, retransmits float64) {
	r := iperf("-t", fmt.Sprint(int(d.Seconds())), "-O", "1")
	return r.End.SumReceived.BitsPerSecond / 1e6, r.End.SumSent.Retransmits
}

func udpRun(d time.Duration) (delivered, sent float64) {
	r := iperf("-u", "-b", "0", "-l", "100", "-t", fmt.Sprint(int(d.Seconds())))
	s := r.End.Sum
	if s.Seconds == 0 {
		return 0, 0
	}
	return (s.Packets - s.LostPackets) / s.Seconds, s.Packets / s.Seconds
}

func report(names []string, res map[string]*measure, d time.Duration, repeat int) {
	host, _ := os.Hostname()
	fmt.Printf("## VPN hub benchmark, %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Printf("Machine: %s, %s/%s, %d CPUs (GOMAXPROCS %d), Go %s, shared with other work. iperf3 TCP %s and UDP (100-byte payloads, unlimited rate) 5 s per run, %d interleaved rounds, medians. Hub CPU per packet: the hub process's CPU time during the run over the inner packets it carried (TCP: the segments both spokes sent; UDP: the packets delivered).\n\n",
		host, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), d, repeat)
	fmt.Println("| setup | TUN mtu | TCP Mbit/s | runs | retransmits | hub CPU µs/packet, TCP | runs | UDP pkts/s delivered | offered | hub CPU µs/packet, UDP | spokes CPU s/TCP run | UDP rcvbuf errors hub/a/b |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, n := range names {
		m := res[n]
		mtu := fmt.Sprint(m.mtu)
		switch n {
		case "vpnhub":
			mtu = "from message 2"
		case "quicfwd":
			mtu = "datagram size"
		}
		ss := m.samples
		rcv := func(i int) float64 { return medianOf(ss, func(s sample) float64 { return s.rcvbufErrs[i] }) }
		fmt.Printf("| %s | %s | %.0f | %s | %.0f | %.2f | %s | %.0f | %.0f | %.2f | %.1f | %.0f/%.0f/%.0f |\n", n, mtu,
			medianOf(ss, func(s sample) float64 { return s.tcpMbps }), runs(ss, func(s sample) float64 { return s.tcpMbps }, "%.0f"),
			medianOf(ss, func(s sample) float64 { return s.retrans }),
			medianOf(ss, sample.hubCPUPerPacket), runs(ss, sample.hubCPUPerPacket, "%.2f"),
			medianOf(ss, func(s sample) float64 { return s.udpPPS }), medianOf(ss, func(s sample) float64 { return s.udpSent }),
			medianOf(ss, sample.udpCPUPerPacket), medianOf(ss, func(s sample) float64 { return s.tcpSpokesCPU }), rcv(0), rcv(1), rcv(2))
	}
	ratio := func(a, b string) {
		v, w := res[a], res[b]
		if v == nil || w == nil || len(w.samples) == 0 {
			return
		}
		med := func(m *measure, f func(sample) float64) float64 { return medianOf(m.samples, f) }
		tcp := func(s sample) float64 { return s.tcpMbps }
		pps := func(s sample) float64 { return s.udpPPS }
		fmt.Printf("\n%s / %s: TCP throughput %.2f×, hub CPU per packet %.2f× (TCP) %.2f× (UDP), UDP pkts/s %.2f×", a, b,
			med(v, tcp)/med(w, tcp), med(v, sample.hubCPUPerPacket)/med(w, sample.hubCPUPerPacket),
			med(v, sample.udpCPUPerPacket)/med(w, sample.udpCPUPerPacket), med(v, pps)/med(w, pps))
	}
	ratio("vpnhub", "wireguard")
	ratio("vpnhub", "udpfwd")
	ratio("vpnhub", "quicfwd")
	ratio("quicfwd", "wireguard")
	ratio("wireguard", "udpfwd")
	fmt.Println()
	if v := res["vpnhub"]; v != nil && v.hubStats != "" {
		fmt.Printf("\nour hub's counters, last round: `%s`\n", v.hubStats)
	}
}
