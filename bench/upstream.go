package main

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The upstream suite measures what the relay itself costs on the node → Cloudly path (README.md#measuring-it).
// The relay runs as its own process, built from ./cmd/relay and started with `relay run`
// (plaintext on loopback), pinned to one core; Cloudly's stand-in and the nodes (testenv/sim) run
// in one process pinned to the other core, so the relay's work is no longer subtracted from
// Cloudly's. Three hops, each with its own peers process, are measured in interleaved rounds:
//
//   - direct: the nodes talk to the stand-in with nothing between;
//   - relay: through the relay;
//   - forwarder: through bench/forwarder, the least a WebSocket multiplexer can do, on the same
//     WebSocket library, pinned to the relay's core.
//
// Around every phase the suite reads the processes' utime+stime (/proc/<pid>/stat) and every
// core's busy time (/proc/stat): the hop's CPU per request, and how busy other processes kept
// each core meanwhile (the machine is shared), are reported beside each figure.

var relayPerf = flag.String("relayperf", "", "upstream suite: after the rounds, record the relay's and the forwarder's CPU with `perf record -g` into this directory")

const (
	hopCPU        = 0  // the core of the relay or the forwarder
	peersCPU      = 1  // the core of Cloudly's stand-in and the nodes
	upstreamNodes = 64 // nodes sending back to back
	clockTick     = 10 * time.Millisecond
	disturbed     = 0.20 // a phase in which others kept a core busier than this is marked
)

var hopNames = []string{"direct", "relay", "forwarder"}

// hop is one path from the nodes to Cloudly's stand-in.
type hop struct {
	name  string
	peers *driver
	proc  *exec.Cmd  // the relay or the forwarder; nil for direct
	logs  *lastLines // its standard error, last lines
}

// phase is one measured load phase.
type phase struct {
	round, nodes int
	hop          string
	load         driverReport
	hopCPU       time.Duration // the relay's or the forwarder's utime+stime
	hopReads     int64         // its read system calls (/proc/<pid>/io syscr)
	hopWrites    int64         // its write system calls (syscw)
	peersCPU     time.Duration
	others       [2]float64 // share of the hop's and of the peers' core other processes kept busy
}

func (p phase) rate() float64 { return rate(p.load) }

func (p phase) perRequest(d time.Duration) float64 {
	return float64(d.Microseconds()) / float64(max(p.load.Requests, 1))
}

// runUpstream: 64 nodes, node → Cloudly round trips, direct, through the relay and through the
// minimal forwarder, each hop on its own core.
func runUpstream(cfg benchConfig, w *bytes.Buffer) error {
	if runtime.NumCPU() < 2 {
		return errors.New("needs two cores: one for the relay, one for its peers")
	}
	rounds, lightSeconds := 5, 5.0
	if cfg.quick {
		rounds, lightSeconds = 3, 2
	}
	bin, err := os.MkdirTemp("", "relay-upstream-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	if err := buildBinaries(bin); err != nil {
		return err
	}
	loadBefore := loadAverage()
	hops := map[string]*hop{}
	defer func() {
		for _, h := range hops {
			h.stop()
		}
	}()
	for _, name := range hopNames {
		h, err := startHop(name, bin)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		hops[name] = h
	}
	ours := map[int]int{} // every process of ours that runs during a phase → its core
	for _, h := range hops {
		ours[h.peers.cmd.Process.Pid] = peersCPU
		if h.proc != nil {
			ours[h.proc.Process.Pid] = hopCPU
		}
	}
	for _, name := range hopNames { // warm up: connections, buffers, the first collections
		if _, err := hops[name].peers.load(1, upstreamNodes); err != nil {
			return err
		}
	}
	var phases []phase
	for round := range rounds {
		for i := range hopNames {
			h := hops[hopNames[(i+round)%len(hopNames)]]
			for _, load := range []struct {
				seconds float64
				nodes   int
			}{{cfg.seconds, upstreamNodes}, {lightSeconds, 1}} {
				p, err := h.measure(load.seconds, load.nodes, ours)
				if err != nil {
					return fmt.Errorf("%s: %w", h.name, err)
				}
				p.round = round + 1
				phases = append(phases, p)
				fmt.Fprintf(os.Stderr, "bench: upstream round %d %-9s %2d nodes: %6.0f requests/s, p99 %.2f ms, %.1f µs CPU a request, others %.0f%%/%.0f%%\n",
					p.round, p.hop, p.nodes, p.rate(), p.load.P99us/1000, p.perRequest(p.hopCPU), 100*p.others[0], 100*p.others[1])
			}
		}
	}
	loadAfter := loadAverage()
	writeUpstream(w, cfg, rounds, lightSeconds, phases, loadBefore, loadAfter)
	if *relayPerf != "" {
		return profileHops(w, cfg, hops, ours)
	}
	return nil
}

// buildBinaries builds the relay and the forwarder into dir.
func buildBinaries(dir string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	for _, pkg := range []string{"./cmd/relay", "./bench/forwarder"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, filepath.Base(pkg)), pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return nil
}

// pin is the command prefix that runs a program on one core only.
func pin(cpu int) []string { return []string{"taskset", "-c", strconv.Itoa(cpu)} }

// startHop starts a hop's peers and, for relay and forwarder, the process between them, and
// connects and registers the nodes.
func startHop(name, bin string) (*hop, error) {
	mode := "direct"
	if name == "relay" {
		mode = "relay"
	}
	peers, hello, err := startPeers(mode, pin(peersCPU))
	if err != nil {
		return nil, err
	}
	h := &hop{name: name, peers: peers, logs: &lastLines{}}
	url := hello.CloudlyURL
	switch name {
	case "relay":
		token := filepath.Join(bin, "jwt")
		if err := os.WriteFile(token, []byte(hello.Token), 0o600); err != nil {
			h.stop()
			return nil, err
		}
		url, err = h.start("relay serving", filepath.Join(bin, "relay"), "run",
			"--cluster-id", hello.ClusterID, "--node-id", "relay-node", "--cloudly-url", hello.CloudlyURL,
			"--cloudly-token-file", token, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
			"--advertise-address", "192.0.2.1", "--insecure-plaintext", "--log-format", "json")
	case "forwarder":
		url, err = h.start("listening ", filepath.Join(bin, "forwarder"), "-listen", "127.0.0.1:0", "-upstream", hello.CloudlyURL)
	}
	if err != nil {
		h.stop()
		return nil, err
	}
	if _, err := peers.connect(url, upstreamNodes); err != nil {
		h.stop()
		return nil, fmt.Errorf("%w\n%s", err, h.logs)
	}
	return h, nil
}

// start runs the hop's process on the hop's core and returns the ws:// URL nodes dial, read from
// the first output line containing ready: the relay logs its listen address (JSON on standard
// error), the forwarder prints it.
func (h *hop) start(ready, path string, args ...string) (string, error) {
	cmd := exec.Command(pin(hopCPU)[0], append(append(pin(hopCPU)[1:], path), args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SERVEZONE_RELAY_") { // the flags above, nothing from the caller
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM} // never outlive the bench
	stderr, _ := cmd.StderrPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return "", err
	}
	h.proc = cmd
	addr := make(chan string, 1)
	scan := func(r io.Reader) {
		s := bufio.NewScanner(r)
		for s.Scan() {
			line := s.Text()
			h.logs.add(line)
			if !strings.Contains(line, ready) {
				continue
			}
			var logged struct {
				Listen string `json:"listen"`
			}
			if json.Unmarshal([]byte(line), &logged) == nil && logged.Listen != "" {
				addr <- logged.Listen
			} else if a, ok := strings.CutPrefix(line, "listening "); ok {
				addr <- a
			}
		}
	}
	go scan(stderr)
	go scan(stdout)
	select {
	case a := <-addr:
		return "ws://" + a + "/", nil
	case <-time.After(30 * time.Second):
		return "", fmt.Errorf("%s did not start listening\n%s", filepath.Base(path), h.logs)
	}
}

// measure runs one closed-loop phase and what it cost. ours maps every process of ours to the
// core it is pinned to: what else kept that core busy was other processes' work.
func (h *hop) measure(seconds float64, nodes int, ours map[int]int) (phase, error) {
	before := takeSnapshot(ours)
	load, err := h.peers.load(seconds, nodes)
	after := takeSnapshot(ours)
	if err != nil {
		return phase{}, err
	}
	if load.Errors > 0 && load.Requests == 0 {
		return phase{}, fmt.Errorf("every request failed\n%s", h.logs)
	}
	p := phase{hop: h.name, nodes: nodes, load: load, peersCPU: after.cpu[h.peers.cmd.Process.Pid] - before.cpu[h.peers.cmd.Process.Pid]}
	if pid := h.pid(); pid != 0 {
		p.hopCPU = after.cpu[pid] - before.cpu[pid]
		p.hopReads = after.io[pid][0] - before.io[pid][0]
		p.hopWrites = after.io[pid][1] - before.io[pid][1]
	}
	// A core's busy time in /proc/stat is sampled at each tick, and the tick stops while a core
	// idles: short bursts go uncounted. Its idle time is exact, so what was not idle, minus our
	// processes' exact CPU time, is the other processes' (and the hypervisor's, as steal).
	wall := after.at.Sub(before.at)
	for i, core := range []int{hopCPU, peersCPU} {
		busy := wall - (after.cores[core].idle - before.cores[core].idle)
		for pid, c := range ours {
			if c == core {
				busy -= after.cpu[pid] - before.cpu[pid]
			}
		}
		p.others[i] = max(0, float64(busy)/float64(wall))
	}
	return p, nil
}

// pid is the relay's or the forwarder's process id; 0 for direct.
func (h *hop) pid() int {
	if h.proc == nil {
		return 0
	}
	return h.proc.Process.Pid
}

func (h *hop) stop() {
	if h.proc != nil {
		h.proc.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { h.proc.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			h.proc.Process.Kill()
			<-done
		}
	}
	h.peers.stop()
}

// snapshot is the CPU time of our processes and of every core at one moment.
type snapshot struct {
	at    time.Time
	cpu   map[int]time.Duration
	io    map[int][2]int64 // read and write system calls
	cores []coreTime
}

type coreTime struct{ idle time.Duration } // idle and waiting for I/O

func takeSnapshot(pids map[int]int) snapshot {
	s := snapshot{at: time.Now(), cpu: map[int]time.Duration{}, io: map[int][2]int64{}}
	for pid := range pids {
		var calls [2]int64
		for _, line := range strings.Split(readFile(fmt.Sprintf("/proc/%d/io", pid)), "\n") {
			if v, ok := strings.CutPrefix(line, "syscr: "); ok {
				calls[0], _ = strconv.ParseInt(v, 10, 64)
			} else if v, ok := strings.CutPrefix(line, "syscw: "); ok {
				calls[1], _ = strconv.ParseInt(v, 10, 64)
			}
		}
		s.io[pid] = calls
		// utime and stime, fields 14 and 15, counted after the command name's closing parenthesis.
		stat := readFile(fmt.Sprintf("/proc/%d/stat", pid))
		if i := strings.LastIndexByte(stat, ')'); i >= 0 {
			f := strings.Fields(stat[i+1:])
			if len(f) > 12 {
				u, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				s.cpu[pid] = time.Duration(u+st) * clockTick
			}
		}
	}
	for _, line := range strings.Split(readFile("/proc/stat"), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		idle, _ := strconv.ParseInt(f[4], 10, 64) // user nice system idle iowait …
		iowait, _ := strconv.ParseInt(f[5], 10, 64)
		s.cores = append(s.cores, coreTime{idle: time.Duration(idle+iowait) * clockTick})
	}
	for len(s.cores) < 2 {
		s.cores = append(s.cores, coreTime{})
	}
	return s
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func loadAverage() string {
	f := strings.Fields(readFile("/proc/loadavg"))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// writeUpstream writes the section: the medians per hop with their spread, the figures the goals
// are about, and every phase.
func writeUpstream(w *bytes.Buffer, cfg benchConfig, rounds int, lightSeconds float64, phases []phase, loadBefore, loadAfter string) {
	of := func(hop string, nodes int) []phase {
		var out []phase
		for _, p := range phases {
			if p.hop == hop && p.nodes == nodes {
				out = append(out, p)
			}
		}
		return out
	}
	reqs := phase.rate
	p50 := func(p phase) float64 { return p.load.P50us / 1000 }
	p99 := func(p phase) float64 { return p.load.P99us / 1000 }
	cpu := func(p phase) float64 { return p.perRequest(p.hopCPU) }
	calls := func(p phase) float64 { return float64(p.hopReads+p.hopWrites) / float64(max(p.load.Requests, 1)) }
	peers := func(p phase) float64 { return p.perRequest(p.peersCPU) }

	fmt.Fprintf(w, "\n## Upstream: the relay's own cost, %d nodes, node → Cloudly and back\n\n", upstreamNodes)
	fmt.Fprintf(w, "The relay (`relay run` built from ./cmd/relay, plaintext on loopback) runs pinned to core %d; Cloudly's stand-in and the nodes run in one process pinned to core %d (`taskset`), so the relay's work is not subtracted from Cloudly's. "+
		"Baselines in the same run: **direct**, the same peers with nothing between; **forwarder**, `bench/forwarder`, the least a WebSocket multiplexer can do (one upstream socket, correlation ids rewritten, nothing else read; same library, same core as the relay). "+
		"%d interleaved rounds (the order rotates), each a %gs closed loop with %d nodes sending back to back and a %gs one with 1 node; medians across rounds, min–max in brackets. "+
		"CPU per request: the process's utime+stime over the phase (/proc/<pid>/stat) divided by the requests answered; system calls: its read and write calls (/proc/<pid>/io).\n\n",
		hopCPU, peersCPU, rounds, cfg.seconds, upstreamNodes, lightSeconds)
	fmt.Fprintf(w, "| hop | nodes | requests/s | p50 | p99 | its CPU per request | its system calls per request | peers' CPU per request |\n")
	fmt.Fprintf(w, "| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, nodes := range []int{upstreamNodes, 1} {
		for _, name := range hopNames {
			ps := of(name, nodes)
			own, sys := "—", "—"
			if name != "direct" {
				own, sys = spread(ps, "%.1f µs", cpu), spread(ps, "%.2f", calls)
			}
			fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", name, nodes, spread(ps, "%.0f", reqs),
				spread(ps, "%.3f ms", p50), spread(ps, "%.3f ms", p99), own, sys, spread(ps, "%.1f µs", peers))
		}
	}

	// Each figure is a ratio or a difference of medians; the brackets hold the same taken within
	// each round, phases seconds apart.
	compare := func(a, b string, nodes int, f func(phase) float64, format string, diff bool) string {
		x, y := of(a, nodes), of(b, nodes)
		op := func(u, v float64) float64 {
			if diff {
				return u - v
			}
			return u / v
		}
		var per []float64
		for i := range x {
			per = append(per, op(f(x[i]), f(y[i])))
		}
		s := ratio(per, format)
		return fmt.Sprintf(format, op(median(x, f), median(y, f))) + s[strings.IndexByte(s, ' '):]
	}
	// A core we do not use is no disturbance: direct leaves the hop's core to others.
	used := func(p phase) float64 {
		if p.hop == "direct" {
			return p.others[1]
		}
		return max(p.others[0], p.others[1])
	}
	capacity := 1e6 / median(of("relay", upstreamNodes), cpu)
	fmt.Fprintf(w, "\n- **Throughput through the relay: %s direct** (goal ≥ 0.95×); through the forwarder %s. "+
		"At its CPU per request a whole core carries %.0f requests/s through the relay, %.2f× what the peers manage directly.\n",
		compare("relay", "direct", upstreamNodes, reqs, "%.2f×", false), compare("forwarder", "direct", upstreamNodes, reqs, "%.2f×", false),
		capacity, capacity/median(of("direct", upstreamNodes), reqs))
	fmt.Fprintf(w, "- **Relay CPU per request: %s the forwarder's** (goal ≤ 1.3×); with 1 node %s.\n",
		compare("relay", "forwarder", upstreamNodes, cpu, "%.2f×", false), compare("relay", "forwarder", 1, cpu, "%.2f×", false))
	fmt.Fprintf(w, "- **Added p99: %s ms with %d nodes, %s ms with 1** (goal ≤ 0.5 ms); added p50 %s ms and %s ms.\n",
		compare("relay", "direct", upstreamNodes, p99, "%+.2f", true), upstreamNodes, compare("relay", "direct", 1, p99, "%+.3f", true),
		compare("relay", "direct", upstreamNodes, p50, "%+.2f", true), compare("relay", "direct", 1, p50, "%+.3f", true))
	quiet := func(hop string, nodes int) []phase {
		return slices.DeleteFunc(of(hop, nodes), func(p phase) bool { return used(p) > disturbed })
	}
	if q := func(n int) bool {
		return len(quiet("relay", n)) > 0 && len(quiet("direct", n)) > 0 && len(quiet("forwarder", n)) > 0
	}; q(upstreamNodes) && q(1) {
		m := func(hop string, nodes int, f func(phase) float64) float64 { return median(quiet(hop, nodes), f) }
		fmt.Fprintf(w, "- The same over the phases no other process disturbed (unmarked below; relay, direct, forwarder: %d, %d, %d phases with %d nodes, %d, %d, %d with 1): "+
			"throughput %.2f× direct, CPU per request %.2f× the forwarder's, added p99 %+.2f ms and %+.3f ms, added p50 %+.2f ms and %+.3f ms.\n",
			len(quiet("relay", upstreamNodes)), len(quiet("direct", upstreamNodes)), len(quiet("forwarder", upstreamNodes)), upstreamNodes, len(quiet("relay", 1)), len(quiet("direct", 1)), len(quiet("forwarder", 1)),
			m("relay", upstreamNodes, reqs)/m("direct", upstreamNodes, reqs), m("relay", upstreamNodes, cpu)/m("forwarder", upstreamNodes, cpu),
			m("relay", upstreamNodes, p99)-m("direct", upstreamNodes, p99), m("relay", 1, p99)-m("direct", 1, p99),
			m("relay", upstreamNodes, p50)-m("direct", upstreamNodes, p50), m("relay", 1, p50)-m("direct", 1, p50))
	}

	var busiest []float64
	marked, failed := 0, 0
	for _, p := range phases {
		failed += p.load.Errors
		busiest = append(busiest, 100*used(p))
		if used(p) > disturbed {
			marked++
		}
	}
	fmt.Fprintf(w, "\nThe machine was shared: load average %s at the start, %s at the end. Other processes kept the busier of the cores a phase used %s busy (median, min–max); %d of %d phases above %.0f %% are marked † below. "+
		"A pinned process that waits on its peer yields its core to them, so the relay and the forwarder lose more to this than direct does. Requests that failed: %d.\n",
		loadBefore, loadAfter, ratio(busiest, "%.0f %%"), marked, len(phases), 100*disturbed, failed)
	fmt.Fprintf(w, "\n| round | hop | nodes | requests/s | p50 | p99 | its CPU per request | its system calls per request | peers' CPU per request | others on core %d / %d |\n", hopCPU, peersCPU)
	fmt.Fprintf(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, p := range phases {
		mark := ""
		if used(p) > disturbed {
			mark = " †"
		}
		own, sys := "—", "—"
		if p.hop != "direct" {
			own, sys = fmt.Sprintf("%.1f µs", cpu(p)), fmt.Sprintf("%.2f", calls(p))
		}
		fmt.Fprintf(w, "| %d | %s | %d | %.0f | %.3f ms | %.3f ms | %s | %s | %.1f µs | %.0f %% / %.0f %%%s |\n", p.round, p.hop, p.nodes, p.rate(),
			p50(p), p99(p), own, sys, peers(p), 100*p.others[0], 100*p.others[1], mark)
	}
}

// median is the median of f over phases.
func median(phases []phase, f func(phase) float64) float64 {
	v := make([]float64, 0, len(phases))
	for _, p := range phases {
		v = append(v, f(p))
	}
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	if len(v)%2 == 0 {
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return v[len(v)/2]
}

// spread is the median of f over phases with its min–max.
func spread(phases []phase, format string, f func(phase) float64) string {
	var v []float64
	for _, p := range phases {
		v = append(v, f(p))
	}
	return ratio(v, format)
}

// ratio is the median of v in format, with the min–max after it.
func ratio(v []float64, format string) string {
	if len(v) == 0 {
		return "—"
	}
	s := slices.Sorted(slices.Values(v))
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf(format+" ("+format+"–"+format+")", med, s[0], s[len(s)-1])
}

// profileHops records the relay's and the forwarder's CPU with perf during one more phase each
// with 64 nodes and with 1, and splits it by kind of work (perfSplit), in µs per request.
func profileHops(w *bytes.Buffer, cfg benchConfig, hops map[string]*hop, ours map[int]int) error {
	dir, err := filepath.Abs(*relayPerf)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	type profile struct {
		perRequest map[string]float64 // µs per request by kind of work
		cpu        float64            // µs per request in all
	}
	profiles := map[string]profile{} // "relay 64" → …
	kinds := map[string]bool{}
	loads := []int{upstreamNodes, 1}
	for _, nodes := range loads {
		for _, name := range []string{"relay", "forwarder"} {
			h := hops[name]
			data := filepath.Join(dir, fmt.Sprintf("%s-%d.perf.data", name, nodes))
			rec := exec.Command("perf", "record", "-F", "999", "-g", "-o", data, "-p", strconv.Itoa(h.pid()))
			var out bytes.Buffer
			rec.Stdout, rec.Stderr = &out, &out
			if err := rec.Start(); err != nil {
				return fmt.Errorf("perf record: %w", err)
			}
			time.Sleep(300 * time.Millisecond) // attached before the load starts
			p, err := h.measure(cfg.seconds, nodes, ours)
			rec.Process.Signal(syscall.SIGINT)
			rec.Wait()
			if err != nil {
				return err
			}
			script, err := exec.Command("perf", "script", "-i", data, "-F", "ip,sym").Output()
			if err != nil {
				return fmt.Errorf("perf script: %v (%s)", err, out.String())
			}
			counts, total := perfSplit(bytes.NewReader(script))
			pr := profile{perRequest: map[string]float64{}, cpu: p.perRequest(p.hopCPU)}
			for k, n := range counts {
				pr.perRequest[k] = pr.cpu * float64(n) / float64(max(total, 1))
				kinds[k] = true
			}
			profiles[fmt.Sprintf("%s %d", name, nodes)] = pr
		}
	}
	order := slices.Collect(maps.Keys(kinds))
	key := fmt.Sprintf("relay %d", upstreamNodes)
	slices.SortFunc(order, func(a, b string) int { return cmp.Compare(profiles[key].perRequest[b], profiles[key].perRequest[a]) })
	fmt.Fprintf(w, "\nWhere the CPU per request goes: `perf record -F 999 -g` of the relay and of the forwarder over one more %gs phase each (not among the figures above), samples split by kind of work (the innermost system call, Go runtime part or package), in µs per request. perf data in `%s`.\n\n", cfg.seconds, *relayPerf)
	fmt.Fprintf(w, "| kind of work | relay, %[1]d nodes | forwarder, %[1]d nodes | relay − forwarder | relay, 1 node | forwarder, 1 node | relay − forwarder |\n| --- | --- | --- | --- | --- | --- | --- |\n", upstreamNodes)
	row := func(label string, v func(profile) float64) {
		fmt.Fprintf(w, "| %s |", label)
		for _, nodes := range loads {
			r, f := v(profiles[fmt.Sprintf("relay %d", nodes)]), v(profiles[fmt.Sprintf("forwarder %d", nodes)])
			fmt.Fprintf(w, " %.2f µs | %.2f µs | %+.2f µs |", r, f, r-f)
		}
		fmt.Fprintln(w)
	}
	const small = 0.25 // µs per request: kinds below it everywhere are summed in one row
	var rest []string
	for _, k := range order {
		if slices.ContainsFunc(slices.Collect(maps.Values(profiles)), func(p profile) bool { return p.perRequest[k] >= small }) {
			row(k, func(p profile) float64 { return p.perRequest[k] })
		} else {
			rest = append(rest, k)
		}
	}
	row(fmt.Sprintf("everything below %.1f µs", small), func(p profile) float64 {
		sum := 0.0
		for _, k := range rest {
			sum += p.perRequest[k]
		}
		return sum
	})
	row("**all**", func(p profile) float64 { return p.cpu })
	return nil
}

// lastLines keeps the last lines a process wrote, for error messages.
type lastLines struct {
	mu    sync.Mutex
	lines []string // guarded by mu
}

func (t *lastLines) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, line)
	if len(t.lines) > 20 {
		t.lines = t.lines[1:]
	}
}

func (t *lastLines) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}
