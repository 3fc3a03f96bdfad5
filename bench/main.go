// Command bench runs the relay's whole-system benchmarks (README.md#measuring-it) on this machine and writes
// bench/RESULTS.md: the machine, the date, the exact command, every figure and its ratio against a
// baseline measured in the same run.
//
//	go run ./bench                 # every suite, full length
//	go run ./bench -quick          # shorter runs, 1 000 nodes at most
//	go run ./bench -suites upstream
//	go run ./bench -suites upstream -relayperf /tmp/relayperf   # and where the relay's CPU goes
//	go run ./bench -suites nobyte   # the hostile load, the relay on its own core (nobyte.go)
//
// The upstream suite runs the relay (built from ./cmd/relay) and a minimal forwarder as their own
// processes on one core, Cloudly's stand-in and the nodes on the other. The scale suite runs the
// relay and the Cloudly stand-in in this process and the simulated nodes in a child process (this
// binary with -driver), so the relay's memory per connection is its own.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"
)

type suite struct {
	name string
	run  func(cfg benchConfig, w *bytes.Buffer) error
}

var memProfile string

type benchConfig struct {
	quick   bool
	seconds float64 // length of each load phase
}

var suites = []suite{
	{"upstream", runUpstream},
	{"scale", runScale},
	{"escrow", goBench("Escrow: 10 000 nodes × 23 renewals",
		"Memory held against the raw JSON of the runs (target ≤ 1.5×) and the delay from a slot opening to the push, p50/p99 (target p99 ≤ 50 ms), all 10 000 slots opening at once; in process, then through a real relay.",
		"./escrow/", "Escrow10k", "1x", 3)},
	{"escrow-relay", goBench("Escrow: release delay through a real relay",
		"The same release, nodes on real sockets through the relay (1 000 nodes: 10 000 need more file descriptors than this machine allows one process).",
		"./daemon/", "EscrowReleaseThroughRelay", "1x", 3)},
	{"vpnhub", runVPNHub},
	{"ingress", goBench("Ingress: route-table reads and change hints",
		"Reads per second of a 4 MiB table by 100 ingress connections through the relay, and the time to hint 100 connections; in-process costs beside.",
		"./ingress/", ".", "3s", 3)},
	{"registry", goBench("Registry: 200 MiB pulls direct and through the relay",
		"Throughput of 1 and 10 concurrent pullers, direct, through the relay with a cold cache and with a warm one (targets: cold ≥ 0.9× direct, warm 10-puller aggregate ≥ 5× cold).",
		"./bench/registry/", "Pull200MiB", "1x", 3)},
	{"faults", runFaults},
	{"ha", goBench("HA: handover, failover, escrow across a failover (docs/ha.md)",
		"Two relay processes against a real kube-apiserver and etcd (bash testenv/kubeapi/build.sh builds them), ten nodes through a Service stand-in: node requests refused across a graceful handover (goal ≤ 2000 ms), SIGKILL to the standby attached (goal ≤ lease + 3 s; lease 4 s here), renewals missed across a failover during a Cloudly outage (goal 0), two relays attached at once (goal 0).",
		"./faults/failover/", "HA", "5x", 1)},
	{"streams", runStreams},
	{"nobyte", runNoByte},
}

func main() {
	driverMode := flag.Bool("driver", false, "internal: run as the node driver child")
	url := flag.String("url", "", "internal: driver target URL")
	n := flag.Int("n", 0, "internal: driver node count")
	prefix := flag.String("prefix", "node-", "internal: driver node id prefix")
	out := flag.String("out", "bench/RESULTS.md", "where to write the results")
	only := flag.String("suites", "", "comma-separated suites to run (default: all)")
	quick := flag.Bool("quick", false, "shorter runs and at most 1 000 nodes")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the relay's process here")
	flag.StringVar(&memProfile, "memprofile", "", "write a heap profile of the relay's process with idle nodes connected")
	flag.Parse()
	if *driverMode {
		if err := runDriver(*url, *n, *prefix); err != nil {
			fmt.Fprintln(os.Stderr, "driver:", err)
			os.Exit(1)
		}
		return
	}
	raiseFileLimit()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			pprof.StartCPUProfile(f)
			defer pprof.StopCPUProfile()
		}
	}
	cfg := benchConfig{quick: *quick, seconds: 10}
	if *quick {
		cfg.seconds = 3
	}
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	sections := filepath.Join(root, "bench", "results", "sections")
	os.MkdirAll(sections, 0o755)
	command := "go run ./bench " + strings.Join(os.Args[1:], " ")
	for _, s := range suites {
		if *only != "" && !strings.Contains(","+*only+",", ","+s.name+",") {
			continue
		}
		fmt.Fprintf(os.Stderr, "bench: %s …\n", s.name)
		start := time.Now()
		var body bytes.Buffer
		err := s.run(cfg, &body)
		if err != nil {
			fmt.Fprintf(&body, "\n**%s failed:** %v\n", s.name, err)
			fmt.Fprintf(os.Stderr, "bench: %s failed: %v\n", s.name, err)
		}
		fmt.Fprintf(&body, "\n_Measured %s by `%s`._\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), strings.TrimSpace(command))
		if werr := os.WriteFile(filepath.Join(sections, s.name+".md"), body.Bytes(), 0o644); werr != nil {
			fmt.Fprintln(os.Stderr, "bench:", werr)
		}
		fmt.Fprintf(os.Stderr, "bench: %s done in %s\n", s.name, time.Since(start).Round(time.Second))
	}
	var doc bytes.Buffer
	fmt.Fprintf(&doc, "# Benchmark results\n\n")
	fmt.Fprintf(&doc, "Written by `go run ./bench` (`-suites a,b` runs some; each section says when and how it was measured).\n\n")
	fmt.Fprintf(&doc, "- machine: %s, %d cores (shared and noisy: compare ratios, not absolutes)\n", hostDescription(), runtime.NumCPU())
	fmt.Fprintf(&doc, "- Go: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	for _, s := range suites {
		if b, err := os.ReadFile(filepath.Join(sections, s.name+".md")); err == nil {
			doc.Write(b)
		}
	}
	path := *out
	if !filepath.IsAbs(path) {
		path = filepath.Join(root, path)
	}
	if err := writeResults(path, doc.Bytes()); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "bench: wrote %s\n", path)
}

// writeResults replaces the generated part of the results file and keeps any hand-written part
// after the marker line (profiles, notes on misses).
func writeResults(path string, generated []byte) error {
	const marker = "<!-- notes: kept across runs -->"
	var notes []byte
	if old, err := os.ReadFile(path); err == nil {
		if i := bytes.Index(old, []byte(marker)); i >= 0 {
			notes = old[i:]
		}
	}
	if notes == nil {
		notes = []byte(marker + "\n")
	}
	return os.WriteFile(path, append(append(generated, '\n'), notes...), 0o644)
}
