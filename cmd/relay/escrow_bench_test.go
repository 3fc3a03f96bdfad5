package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/testenv/relaytest"
	"code.foss.global/serve.zone/relay/internal/testenv/sim"
	"code.foss.global/serve.zone/relay/relay"
)

// BenchmarkEscrowReleaseThroughRelay measures escrow release over real sockets: N simulated nodes
// (ESCROW_BENCH_NODES, default 1000) registered through a relay built as cmd/relay builds it, one
// run each whose slots open for every node at the same instant, Cloudly cut off, and the delay
// from each slot opening to the node receiving the renewal, over three slots. Run it once:
// -bench EscrowReleaseThroughRelay -benchtime 1x.
func BenchmarkEscrowReleaseThroughRelay(b *testing.B) {
	nodes := 1000
	if s := os.Getenv("ESCROW_BENCH_NODES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("ESCROW_BENCH_NODES=%q", s)
		}
		nodes = n
	}
	for range b.N {
		benchEscrowThroughRelay(b, nodes)
	}
}

func benchEscrowThroughRelay(b *testing.B, nodes int) {
	e := relaytest.Start(b, relaytest.Options{Build: build, Quiet: true,
		Configure: func(cfg *relay.Config) { cfg.BuildVersion = buildVersion }})
	defer e.Close()
	cloudly, log, url := e.Cloudly, e.Log, e.URL
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	sims := make([]*sim.Node, nodes)
	counters := make([]*sim.RenewalCounter, nodes)
	var g errgroup.Group
	g.SetLimit(32)
	for i := range sims {
		sims[i] = sim.NewNode(fmt.Sprintf("node-%05d", i), log)
		sims[i].AutoReregister = false
		counters[i] = sim.RecordRenewals(sims[i])
		g.Go(func() error {
			if err := sims[i].Connect(ctx, url); err != nil {
				return err
			}
			rctx, rcancel := context.WithTimeout(ctx, time.Minute)
			defer rcancel()
			_, err := sims[i].Register(rctx)
			return err
		})
	}
	defer func() {
		for _, n := range sims {
			if n.Conn() != nil {
				n.Close()
			}
		}
	}()
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}

	const step, bursts = 2 * time.Second, 3
	t0 := time.Now().Add(2*time.Second + time.Duration(nodes)*time.Millisecond).Truncate(time.Second)
	for _, n := range sims {
		body, err := sim.EscrowRun{Session: n.Session(), Start: t0, Count: bursts + 1, Step: step, Window: 3 * time.Second}.Request()
		if err != nil {
			b.Fatal(err)
		}
		resp, err := cloudly.Call(ctx, contracts.MethodHoldRuntimeNetworkDnsLeaseRenewals, body)
		if err != nil || contracts.BindHoldRuntimeNetworkDnsLeaseRenewalsResponse(resp, bursts+1) != nil {
			b.Fatalf("hold: %s %v", resp, err)
		}
	}
	if time.Until(t0) < 300*time.Millisecond {
		b.Fatalf("holding took too long: t0 is %v away", time.Until(t0))
	}
	cloudly.SetAvailable(false)
	time.Sleep(time.Until(t0.Add(bursts*step - step/2)))

	var delays []time.Duration
	admitted := 0
	for _, c := range counters {
		for _, rc := range c.Receipts() {
			delays = append(delays, rc.At.Sub(t0.Add(time.Duration(rc.Sequence-1)*step)))
			if rc.Status == contracts.ApplyStatusAccepted {
				admitted++
			}
		}
	}
	if len(delays) != nodes*bursts || admitted != nodes*bursts {
		b.Fatalf("%d pushes, %d admitted; want %d", len(delays), admitted, nodes*bursts)
	}
	slices.Sort(delays)
	p := func(q float64) float64 {
		return float64(delays[int(q*float64(len(delays)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(p(0.50), "p50-ms")
	b.ReportMetric(p(0.99), "p99-ms")
	b.ReportMetric(p(1), "max-ms")
	b.ReportMetric(float64(nodes), "nodes")
}
