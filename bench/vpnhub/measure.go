package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// What one setup measured in one round. CPU is read from /proc/<pid>/stat around each iperf3 run,
// so setup and teardown are not counted; packets are counted by the kernels of the namespaces.

type sample struct {
	tcpMbps, retrans float64
	tcpPackets       float64 // inner packets through the hub in the TCP run: TCP segments a and b sent
	tcpHubCPU        float64 // hub CPU seconds in the TCP run
	tcpSpokesCPU     float64
	udpPPS, udpSent  float64 // iperf3 UDP packets per second delivered, and offered
	udpPackets       float64 // inner packets b received in the UDP run
	udpHubCPU        float64
	rcvbufErrs       [3]float64 // UDP receive-buffer errors in the hub's, a's and b's namespaces, both runs
}

// hubCPUPerPacket is µs of hub CPU per forwarded packet in the TCP run.
func (s sample) hubCPUPerPacket() float64 { return 1e6 * s.tcpHubCPU / max(s.tcpPackets, 1) }

// udpCPUPerPacket is µs of hub CPU per packet delivered in the UDP run.
func (s sample) udpCPUPerPacket() float64 { return 1e6 * s.udpHubCPU / max(s.udpPackets, 1) }

// cpuSeconds is the user and system CPU time pid has used, in seconds.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // after "pid (comm) "
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// snmp reads /proc/net/snmp inside ns: "Tcp.OutSegs", "Udp.RcvbufErrors", ….
func snmp(ns string) map[string]float64 {
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/net/snmp").Output()
	if err != nil {
		return nil
	}
	m := map[string]float64{}
	var names []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		proto, rest, _ := strings.Cut(sc.Text(), ":")
		f := strings.Fields(rest)
		if len(f) > 0 && f[0][0] >= 'A' && f[0][0] <= 'Z' {
			names = f
			continue
		}
		for i, v := range f {
			if i < len(names) {
				x, _ := strconv.ParseFloat(v, 64)
				m[proto+"."+names[i]] = x
			}
		}
	}
	return m
}

// counters is a snapshot of everything a run is measured by.
type counters struct {
	hubCPU, spokesCPU float64
	net               [3]map[string]float64 // hub, a, b
}

func snapshot(s *setup) counters {
	var c counters
	for i, p := range s.procs {
		if i == 0 {
			c.hubCPU = cpuSeconds(p.cmd.Process.Pid)
		} else {
			c.spokesCPU += cpuSeconds(p.cmd.Process.Pid)
		}
	}
	for i, ns := range []string{nsHub, nsA, nsB} {
		c.net[i] = snmp(ns)
	}
	return c
}

func (c counters) since(before counters, key string, ns int) float64 {
	return c.net[ns][key] - before.net[ns][key]
}

// measureRound runs the TCP and the UDP test against a setup that is up.
func measureRound(s *setup, d time.Duration, udp bool) sample {
	var r sample
	before := snapshot(s)
	r.tcpMbps, r.retrans = tcpRun(d)
	after := snapshot(s)
	r.tcpHubCPU, r.tcpSpokesCPU = after.hubCPU-before.hubCPU, after.spokesCPU-before.spokesCPU
	r.tcpPackets = after.since(before, "Tcp.OutSegs", 1) + after.since(before, "Tcp.OutSegs", 2)
	for i := range r.rcvbufErrs {
		r.rcvbufErrs[i] = after.since(before, "Udp.RcvbufErrors", i)
	}
	if udp {
		before = snapshot(s)
		r.udpPPS, r.udpSent = udpRun(5 * time.Second)
		after = snapshot(s)
		r.udpHubCPU = after.hubCPU - before.hubCPU
		r.udpPackets = r.udpPPS * 5
		for i := range r.rcvbufErrs {
			r.rcvbufErrs[i] += after.since(before, "Udp.RcvbufErrors", i)
		}
	}
	return r
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// medianOf is the median of f over samples.
func medianOf(samples []sample, f func(sample) float64) float64 {
	xs := make([]float64, len(samples))
	for i, s := range samples {
		xs[i] = f(s)
	}
	return median(xs)
}

func runs(samples []sample, f func(sample) float64, format string) string {
	out := make([]string, len(samples))
	for i, s := range samples {
		out[i] = fmt.Sprintf(format, f(s))
	}
	return strings.Join(out, ", ")
}
