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
	"slices"
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
	tcpMbps    []float64
	retrans    []float64
	udpPPS     float64 // delivered packets per second, 100-byte payloads
	udpSentPPS float64
	hubCPU     []float64 // seconds of CPU per TCP run, hub process
	spokeCPU   []float64 // seconds, both spokes
	mtu        int
	hubStats   string
}

func orchestrate(args []string) {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	duration := fs.Duration("duration", 10*time.Second, "iperf3 TCP duration per run")
	repeat := fs.Int("repeat", 3, "rounds; each runs every setup once")
	wgPath := fs.String("wireguard", "/tmp/wgbin/wireguard", "the wireguard-go binary")
	only := fs.String("only", "vpnhub,wireguard,udpfwd", "setups to run")
	profDir := fs.String("cpuprofile", "", "write our hub's CPU profile of each round here")
	udp := fs.Bool("udp", true, "measure UDP packets per second in round 1")
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
			mbps, retr := tcpRun(*duration)
			if round == 1 && *udp {
				m.udpPPS, m.udpSentPPS = udpRun(5 * time.Second)
			}
			hub, spokes := stop(s)
			m.tcpMbps = append(m.tcpMbps, mbps)
			m.retrans = append(m.retrans, retr)
			m.hubCPU = append(m.hubCPU, hub)
			m.spokeCPU = append(m.spokeCPU, spokes)
			if n == "vpnhub" {
				m.hubStats = strings.TrimSpace(s.procs[0].out.String())
				for _, p := range s.procs[1:] {
					fmt.Fprintf(os.Stderr, "  %s: %s\n", p.name, strings.TrimSpace(p.out.String()))
				}
				fmt.Fprintf(os.Stderr, "  hub: %s\n", m.hubStats)
				for _, ns := range []string{nsHub, nsA, nsB} {
					out, _ := exec.Command("ip", "netns", "exec", ns, "nstat", "-az", "UdpRcvbufErrors", "UdpSndbufErrors", "UdpInErrors").Output()
					fmt.Fprintf(os.Stderr, "  %s: %s\n", ns, strings.Join(strings.Fields(string(out)), " "))
				}
			}
			fmt.Fprintf(os.Stderr, "round %d %-9s tcp %8.1f Mbit/s  retrans %6.0f  cpu hub %.1fs spokes %.1fs\n", round, n, mbps, retr, hub, spokes)
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
			s.procs = append(s.procs, spawn("vpnhub-client", c.ns, nil, append([]string{self, "client", "-hub", underlayHub + ":4433",
				"-hub-key", contracts.EncodeKey32(hubKey.Public), "-key", filepath.Join(dir, c.key), "-node", c.node,
				"-authority", authority, "-addr", c.addr + "/24"}, extra...)...))
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

// stop ends a setup's processes and returns the CPU seconds the hub and the spokes used.
func stop(s *setup) (hub, spokes float64) {
	for _, p := range s.procs {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for i, p := range s.procs {
		done := make(chan struct{})
		go func() { p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			p.cmd.Process.Kill()
			<-done
		}
		var cpu float64
		if ru, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
		}
		if i == 0 {
			hub = cpu
		} else {
			spokes += cpu
		}
	}
	return hub, spokes
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

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func report(names []string, res map[string]*measure, d time.Duration, repeat int) {
	host, _ := os.Hostname()
	fmt.Printf("## VPN hub benchmark, %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Printf("Machine: %s, %s/%s, %d CPUs (GOMAXPROCS %d), Go %s. iperf3 TCP %s per run, %d interleaved rounds (median); UDP 100-byte payloads, 5 s, round 1.\n\n",
		host, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), d, repeat)
	fmt.Println("| setup | TUN mtu | TCP Mbit/s (median) | runs | retransmits (median) | UDP pkts/s delivered | UDP pkts/s offered | hub CPU s/run | spokes CPU s/run |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, n := range names {
		m := res[n]
		runs := make([]string, len(m.tcpMbps))
		for i, x := range m.tcpMbps {
			runs[i] = fmt.Sprintf("%.0f", x)
		}
		mtu := fmt.Sprint(m.mtu)
		if n == "vpnhub" {
			mtu = "from message 2"
		}
		fmt.Printf("| %s | %s | %.0f | %s | %.0f | %.0f | %.0f | %.1f | %.1f |\n", n, mtu, median(m.tcpMbps), strings.Join(runs, ", "),
			median(m.retrans), m.udpPPS, m.udpSentPPS, median(m.hubCPU), median(m.spokeCPU))
	}
	if v, w := res["vpnhub"], res["wireguard"]; v != nil && w != nil && median(w.tcpMbps) > 0 {
		fmt.Printf("\nvpnhub / wireguard-go: TCP %.2f×, UDP pkts/s %.2f×\n", median(v.tcpMbps)/median(w.tcpMbps), v.udpPPS/w.udpPPS)
	}
	if v, u := res["vpnhub"], res["udpfwd"]; v != nil && u != nil && median(u.tcpMbps) > 0 {
		fmt.Printf("vpnhub / udpfwd: TCP %.2f×, UDP pkts/s %.2f×\n", median(v.tcpMbps)/median(u.tcpMbps), v.udpPPS/u.udpPPS)
	}
	if v := res["vpnhub"]; v != nil && v.hubStats != "" {
		fmt.Printf("\nour hub's counters, last round: `%s`\n", v.hubStats)
	}
}
