package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/interop"
)

// streamsBench is what one run of the streams suite measures.
type streamsBench struct {
	rounds      int
	single      int   // bytes of the one-stream run
	many        int   // nodes streaming at once
	manyBytes   []int // bytes per node of the at-once runs; the first is also run directly
	chunk       int   // bytes per sendData
	sampleEvery time.Duration
}

// runStreams: the published TypedRequest library's VirtualStreams node → Cloudly, through a real
// relay process and with the same peers talking directly, in the same run; and the relay's memory
// while many streams run (interop package: Node.js peers, `bash interop/install.sh` first).
func runStreams(cfg benchConfig, w *bytes.Buffer) error {
	b := streamsBench{rounds: 3, single: 64 << 20, many: 20, manyBytes: []int{4 << 20, 16 << 20}, chunk: 512 << 10,
		sampleEvery: 100 * time.Millisecond}
	if cfg.quick {
		b.rounds, b.single, b.manyBytes = 1, 16<<20, []int{1 << 20, 4 << 20}
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, "interop")
	if err := interop.Ready(dir); err != nil {
		return err
	}
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "relay-bench-streams-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin, err := interop.RelayBinary(ctx, dir, tmp)
	if err != nil {
		return err
	}
	const cluster, token = "cluster-interop", "interop-machine-jwt"
	start, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cloudly, err := interop.StartCloudly(start, dir, interop.CloudlyConfig{Token: token, Offer: contracts.RelayOffer,
		ClusterID: cluster, Origin: "https://relay.cluster-interop.serve.zone:8443"})
	if err != nil {
		return err
	}
	defer cloudly.Close()
	rly, err := interop.StartRelay(start, interop.RelayConfig{Bin: bin, CloudlyURL: cloudly.URL, ClusterID: cluster, Token: token, WorkDir: tmp})
	if err != nil {
		return err
	}
	defer rly.Stop()
	for rly.Ready() != nil {
		if start.Err() != nil {
			return errors.New("relay did not attach")
		}
		time.Sleep(50 * time.Millisecond)
	}
	direct, err := streamNodes(start, dir, cloudly.URL, "direct", b.many)
	if err != nil {
		return err
	}
	defer direct.Close()
	via, err := streamNodes(start, dir, rly.URL(), "relay", b.many)
	if err != nil {
		return err
	}
	defer via.Close()

	// Rounds alternate which path goes first, so that drift on a shared machine favours neither.
	var single, many [2][]float64 // MB/s; [0] direct, [1] through the relay
	var failures []string
	for round := 0; round < b.rounds; round++ {
		for i := range 2 {
			path := (round + i) % 2
			n := [2]*pathNodes{direct, via}[path]
			if r, err := n.upload(ctx, 1, b.single, b.chunk); err != nil {
				failures = append(failures, fmt.Sprintf("one stream, %s: %v", n.name, err))
			} else {
				single[path] = append(single[path], r)
			}
			if r, err := n.upload(ctx, b.many, b.manyBytes[0], b.chunk); err != nil {
				failures = append(failures, fmt.Sprintf("%d streams, %s: %v", b.many, n.name, err))
			} else {
				many[path] = append(many[path], r)
			}
		}
	}

	// Memory: the relay idle with its nodes registered, then at its peak while every node streams.
	type memRow struct {
		perNode    int
		mbps       float64
		idle, peak memSample
		cpu, wall  float64 // relay CPU seconds, and the run's wall seconds
		failed     string
	}
	var mem []memRow
	for _, size := range b.manyBytes {
		row := memRow{perNode: size}
		time.Sleep(2 * time.Second) // let the previous run's garbage go
		row.idle = sampleRelay(rly)
		before, _ := rly.Metrics()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(b.sampleEvery)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					row.peak = row.peak.max(sampleRelay(rly))
				}
			}
		}()
		began := time.Now()
		r, err := via.upload(ctx, b.many, size, b.chunk)
		row.wall = time.Since(began).Seconds()
		close(stop)
		wg.Wait()
		row.peak = row.peak.max(sampleRelay(rly))
		after, _ := rly.Metrics()
		row.cpu = after["process_cpu_seconds_total"] - before["process_cpu_seconds_total"]
		row.mbps = r
		if err != nil {
			row.failed = err.Error()
		}
		mem = append(mem, row)
	}

	fmt.Fprintf(w, "\n## Interop streams: the published TypedRequest library's VirtualStreams, node → Cloudly\n\n")
	relayFrom := "built from this tree"
	if os.Getenv(interop.BinEnv) != "" {
		relayFrom = "the binary `" + interop.BinEnv + "=" + os.Getenv(interop.BinEnv) + "` names"
	}
	fmt.Fprintf(w, "Cloudly and nodes are `@api.global/typedrequest` %s peers on Node.js %s (`interop/peers`), each node its own socket; "+
		"the relay is a real `relay run` process (%s), plaintext on loopback; the baseline is the same peers with the nodes "+
		"connected to Cloudly directly, measured in the same run (rounds alternate which path goes first). A node fires `interopUpload` "+
		"with a VirtualStream and writes random Buffers of %d KiB with `sendData` (≈ %.1f MB frames once the library serialises them), "+
		"then the closing chunk; Cloudly reads to the end and answers the SHA-256, which must match. MB/s counts stream payload bytes "+
		"(10⁶), from firing the request to its answer.\n\n",
		interop.TypedRequestVersion, nodeVersion(), relayFrom, b.chunk>>10, float64(b.chunk)*3.6/1e6)
	fmt.Fprintf(w, "Machine: %s, %d cores, %s (shared with other work: compare the ratios).\n\n", hostDescription(), runtime.NumCPU(), runtime.Version())
	fmt.Fprintf(w, "| path | one stream, %d MiB: MB/s | %d nodes at once, %d MiB each: MB/s in all |\n| --- | --- | --- |\n", b.single>>20, b.many, b.manyBytes[0]>>20)
	fmt.Fprintf(w, "| direct | %s | %s |\n", streamSpread(single[0]), streamSpread(many[0]))
	fmt.Fprintf(w, "| through the relay | %s | %s |\n", streamSpread(single[1]), streamSpread(many[1]))
	fmt.Fprintf(w, "\n**One stream %s direct; %d streams at once %s direct** (goal ≥ 0.8×; medians of %d round(s), min–max in brackets).\n",
		streamRatio(single), b.many, streamRatio(many), b.rounds)
	fmt.Fprintf(w, "\nThe relay process while %d nodes stream at once (sampled every %s; RSS from /proc, Go heap in use from its `/metrics`; "+
		"idle = the relay with its nodes registered, before the run):\n\n", b.many, b.sampleEvery)
	fmt.Fprintf(w, "| per node | in all | MB/s | RSS idle → peak | Go heap in use idle → peak | relay CPU |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, m := range mem {
		if m.failed != "" {
			fmt.Fprintf(w, "| %d MiB | %d MiB | failed: %s | %s → %s | %s → %s | |\n", m.perNode>>20, b.many*m.perNode>>20, oneLine(m.failed),
				mib(m.idle.rss), mib(m.peak.rss), mib(m.idle.heap), mib(m.peak.heap))
			continue
		}
		fmt.Fprintf(w, "| %d MiB | %d MiB | %.1f | %s → %s | %s → %s | %.0f %% of a core |\n", m.perNode>>20, b.many*m.perNode>>20, m.mbps,
			mib(m.idle.rss), mib(m.peak.rss), mib(m.idle.heap), mib(m.peak.heap), 100*m.cpu/m.wall)
	}
	if len(mem) == 2 && mem[0].failed == "" && mem[1].failed == "" {
		fmt.Fprintf(w, "\nFour times the stream length moves the relay's peak RSS by %+.1f MiB: what it holds is bounded by the frames in flight, not by the streams' length.\n",
			float64(mem[1].peak.rss-mem[0].peak.rss)/(1<<20))
	}
	if len(failures) > 0 {
		fmt.Fprintf(w, "\nFailed runs:\n\n")
		for _, f := range failures {
			fmt.Fprintf(w, "- %s\n", oneLine(f))
		}
	}
	return nil
}

// pathNodes is a set of nodes on one path (direct or through the relay), in one process.
type pathNodes struct {
	*interop.Nodes
	name string
	ids  []string
}

func streamNodes(ctx context.Context, dir, url, name string, n int) (*pathNodes, error) {
	nodes, err := interop.StartNodes(ctx, dir)
	if err != nil {
		return nil, err
	}
	p := &pathNodes{Nodes: nodes, name: name}
	for i := 1; i <= n; i++ {
		p.ids = append(p.ids, fmt.Sprintf("%s-%02d", name, i))
	}
	reg, err := nodes.Connect(ctx, url, p.ids, contracts.RelayOffer)
	if err == nil && len(reg.Registered) != n {
		err = fmt.Errorf("%s: %d of %d nodes registered: %+v", name, len(reg.Registered), n, reg.Failures)
	}
	if err != nil {
		nodes.Close()
		return nil, err
	}
	return p, nil
}

// upload has the first n nodes stream size bytes each at once; it returns the payload MB/s in all.
func (p *pathNodes) upload(ctx context.Context, n, size, chunk int) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	u, err := p.Upload(ctx, p.ids[:n], size, chunk)
	if err != nil {
		return 0, err
	}
	for _, r := range u.Results {
		got := r.Received()
		switch {
		case r.Failure != "":
			return 0, fmt.Errorf("%s: %s", r.Node, r.Failure)
		case len(r.Error) > 0:
			return 0, fmt.Errorf("%s: %s", r.Node, r.Error)
		case r.Sent == nil || got == nil || *got != *r.Sent:
			return 0, fmt.Errorf("%s: sent %+v, received %+v", r.Node, r.Sent, got)
		}
	}
	return float64(n*size) / 1e6 / (u.Ms / 1000), nil
}

// memSample is the relay's memory at one moment.
type memSample struct{ rss, heap int64 }

func (s memSample) max(o memSample) memSample {
	return memSample{rss: max(s.rss, o.rss), heap: max(s.heap, o.heap)}
}

func sampleRelay(r *interop.Relay) memSample {
	var s memSample
	s.rss, _ = r.RSS()
	if m, err := r.Metrics(); err == nil {
		s.heap = int64(m["go_memstats_heap_inuse_bytes"])
	}
	return s
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func streamMedian(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func streamSpread(v []float64) string {
	if len(v) == 0 {
		return "failed"
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 1 {
		return fmt.Sprintf("%.1f", s[0])
	}
	return fmt.Sprintf("%.1f (%.1f–%.1f)", streamMedian(s), s[0], s[len(s)-1])
}

func streamRatio(v [2][]float64) string {
	if len(v[0]) == 0 || len(v[1]) == 0 {
		return "—×"
	}
	return fmt.Sprintf("%.2f×", streamMedian(v[1])/streamMedian(v[0]))
}

func nodeVersion() string {
	out, err := exec.Command("node", "--version").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
