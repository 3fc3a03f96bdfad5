package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// BenchmarkNodeToCloudly measures node → Cloudly request round trips with 64 concurrent nodes,
// directly against the Cloudly stand-in and through a relay, in one run. Compare the two
// sub-benchmarks' ns/op and p50/p99 (`go run ./bench` prints the ratios).
func BenchmarkNodeToCloudly(b *testing.B) {
	const concurrency = 64
	body := json.RawMessage(`{"session":{"nodeId":"%s"},"observation":{"sequence":1,"phase":"running","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000"}}`)
	for _, via := range []string{"direct", "relay"} {
		b.Run(via, func(b *testing.B) {
			url, cleanup := benchTarget(b, via)
			defer cleanup()
			nodes := make([]*sim.Node, concurrency)
			var g errgroup.Group
			for i := range nodes {
				g.Go(func() error {
					n := sim.NewNode(fmt.Sprintf("node-%02d", i), zerolog.Nop())
					if err := n.Connect(context.Background(), url); err != nil {
						return err
					}
					nodes[i] = n
					_, err := n.Register(context.Background())
					return err
				})
			}
			if err := g.Wait(); err != nil {
				b.Fatal(err)
			}
			defer func() {
				for _, n := range nodes {
					n.Close()
				}
			}()
			var next atomic.Int64
			lat := make([][]time.Duration, concurrency)
			b.ResetTimer()
			var wg sync.WaitGroup
			for i, n := range nodes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req := json.RawMessage(fmt.Sprintf(string(body), n.ID))
					for next.Add(1) <= int64(b.N) {
						start := time.Now()
						if _, err := n.Call(context.Background(), "reportRuntimeAssignmentObservation", req); err != nil {
							b.Error(err)
							return
						}
						lat[i] = append(lat[i], time.Since(start))
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			all := slices.Concat(lat...)
			slices.Sort(all)
			if len(all) > 0 {
				b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
			}
		})
	}
}

// benchTarget returns the URL nodes dial: the Cloudly stand-in itself, or a relay attached to it.
func benchTarget(b *testing.B, via string) (string, func()) {
	if via == "direct" {
		c, err := sim.NewCloudly(zerolog.Nop())
		if err != nil {
			b.Fatal(err)
		}
		c.AcceptNodesDirectly()
		return c.URL(), c.Close
	}
	e := relaytest.Start(b, relaytest.Options{Quiet: true, PingInterval: typedsocket.DefaultPingInterval, DeadTimeout: typedsocket.DefaultDeadTimeout})
	return e.URL, e.Shutdown
}
