package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// The scale suite runs the relay in this process, so that its memory per idle connection can be
// read off runtime.MemStats; the nodes run in a child process.

// stack is a Cloudly stand-in, and a relay attached to it unless direct.
type stack struct {
	cloudly *sim.Cloudly
	url     string // what nodes dial
	stop    func()
}

func startStack(direct bool) (*stack, error) {
	c, err := sim.NewCloudly(zerolog.Nop())
	if err != nil {
		return nil, err
	}
	if direct {
		c.AcceptNodesDirectly()
		return &stack{cloudly: c, url: c.URL(), stop: c.Close}, nil
	}
	dir, err := os.MkdirTemp("", "relay-bench-")
	if err != nil {
		return nil, err
	}
	token := filepath.Join(dir, "jwt")
	os.WriteFile(token, []byte(c.Token), 0o600)
	cfg := relay.Config{ClusterID: c.ClusterID, NodeID: "relay-node", CloudlyURL: c.URL(), CloudlyTokenFile: token,
		Listen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: "127.0.0.1:0"}
	if err := cfg.Complete(); err != nil {
		return nil, err
	}
	r, err := relay.New(cfg, relay.Features{}, relay.Options{Logger: zerolog.Nop()})
	if err != nil {
		return nil, err
	}
	if err := r.Listen(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); !c.Attached(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			cancel()
			return nil, errors.New("relay did not attach")
		}
	}
	return &stack{cloudly: c, url: "ws://" + r.DownstreamAddr().String() + "/", stop: func() {
		cancel()
		<-done
		c.Close()
		os.RemoveAll(dir)
	}}, nil
}

// measure connects n nodes to a fresh stack and runs a closed loop with `concurrent` of them.
func measure(cfg benchConfig, direct bool, n, concurrent int) (driverReport, driverReport, error) {
	s, err := startStack(direct)
	if err != nil {
		return driverReport{}, driverReport{}, err
	}
	defer s.stop()
	d, reg, err := startDriver(s.url, n, "node-")
	if err != nil {
		return driverReport{}, driverReport{}, err
	}
	defer d.stop()
	load, err := d.load(cfg.seconds, concurrent)
	return reg, load, err
}

func rate(r driverReport) float64 { return float64(r.Requests) / r.Seconds }

// runScale: 1 000 and 10 000 nodes on one upstream socket.
func runScale(cfg benchConfig, w *bytes.Buffer) error {
	counts := []int{1000, 10000}
	if cfg.quick {
		counts = []int{1000}
	}
	fmt.Fprintf(w, "\n## Scale: nodes registered through one relay on one upstream socket\n\n")
	fmt.Fprintf(w, "| nodes | register all | memory per idle node connection | requests/s relay (direct) | ratio | p50 relay (direct) | p99 relay (direct) | others' p99 with a stalled node |\n")
	fmt.Fprintf(w, "| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, n := range counts {
		r, err := scaleRow(cfg, n)
		if err != nil {
			return fmt.Errorf("%d nodes: %w", n, err)
		}
		fmt.Fprintf(w, "| %d | %.2f s | %.1f KiB | %.0f (%.0f) | %.2f× | %.2f ms (%.2f ms) | %.2f ms (%.2f ms) | %.2f ms → %.2f ms (%+.0f %%) |\n",
			n, r.register, r.perConn/1024, rate(r.relay), rate(r.direct), rate(r.relay)/rate(r.direct),
			r.relay.P50us/1000, r.direct.P50us/1000, r.relay.P99us/1000, r.direct.P99us/1000,
			r.calm.P99us/1000, r.stalled.P99us/1000, 100*(r.stalled.P99us/r.calm.P99us-1))
	}
	fmt.Fprintf(w, "\nTargets: memory ≤ 24 KiB per idle node connection; throughput ≥ 0.8× direct; others' p99 moves ≤ 10 %% while one node stops reading (64 nodes active; the stalled node's socket and queue filled until the relay answers relay-node-busy, then Cloudly sends it 100 requests/s).\n")
	return nil
}

type scaleResult struct {
	register, perConn            float64
	relay, direct, calm, stalled driverReport
}

func scaleRow(cfg benchConfig, n int) (scaleResult, error) {
	var res scaleResult
	_, direct, err := measure(cfg, true, n, n)
	if err != nil {
		return res, err
	}
	res.direct = direct

	s, err := startStack(false)
	if err != nil {
		return res, err
	}
	defer s.stop()
	before := liveBytes()
	d, reg, err := startDriver(s.url, n, "node-")
	if err != nil {
		return res, err
	}
	defer d.stop()
	time.Sleep(time.Second)
	res.perConn = float64(liveBytes()-before) / float64(n)
	if memProfile != "" {
		if f, err := os.Create(memProfile); err == nil {
			pprof.WriteHeapProfile(f)
			f.Close()
		}
	}
	res.register = reg.RegisterS
	if res.relay, err = d.load(cfg.seconds, n); err != nil {
		return res, err
	}
	if res.calm, err = d.load(cfg.seconds, 64); err != nil {
		return res, err
	}
	stop, err := stallOne(s)
	if err != nil {
		return res, err
	}
	defer stop()
	res.stalled, err = d.load(cfg.seconds, 64)
	return res, err
}

// liveBytes is the heap and stack in use after a full collection.
func liveBytes() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// stallOne registers a node that never reads, fills what the relay holds for it (its socket and
// its send queue, until the relay answers relay-node-busy), then has Cloudly keep sending to it at
// 100 requests/s, the pace of a busy node's pushes. Whether the stall spills onto the other nodes
// is the question; a flood big enough to load the CPU would measure something else.
func stallOne(s *stack) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stalled, err := sim.DialStalled(ctx, s.url, "node-stalled")
	if err != nil {
		return nil, err
	}
	fill := json.RawMessage(`{"session":{"nodeId":"node-stalled"},"pad":"` + string(bytes.Repeat([]byte("x"), 32<<10)) + `"}`)
	var busy atomic.Bool
	for !busy.Load() {
		if ctx.Err() != nil {
			stalled.Close()
			return nil, errors.New("the stalled node's queue never filled")
		}
		s.cloudly.CallAsync("applyRuntimeAssignment", fill, func(r typedsocket.Reply) {
			if errors.Is(r.Err, contracts.RelayNodeBusy) {
				busy.Store(true)
			}
		})
		time.Sleep(time.Millisecond)
	}
	push := json.RawMessage(`{"session":{"nodeId":"node-stalled"},"pad":"` + string(bytes.Repeat([]byte("x"), 1<<10)) + `"}`)
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				s.cloudly.CallAsync("applyRuntimeAssignment", push, func(typedsocket.Reply) {})
			}
		}
	}()
	return func() { close(quit); <-done; stalled.Close() }, nil
}
