package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"code.foss.global/serve.zone/relay/internal/sim"
	"code.foss.global/serve.zone/relay/relay"
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
	c, err := sim.NewCloudly(zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	if via == "direct" {
		return c.URL(), c.Close
	}
	token := filepath.Join(b.TempDir(), "jwt")
	if err := os.WriteFile(token, []byte(c.Token), 0o600); err != nil {
		b.Fatal(err)
	}
	cfg := relay.Config{ClusterID: c.ClusterID, NodeID: "relay-node", CloudlyURL: c.URL(), CloudlyTokenFile: token,
		Listen: "127.0.0.1:0", AdvertiseAddress: "192.0.2.1", InsecurePlaintext: true, AdminListen: "127.0.0.1:0"}
	if err := cfg.Complete(); err != nil {
		b.Fatal(err)
	}
	r, err := relay.New(cfg, relay.Features{}, zerolog.Nop(), relay.Options{})
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Listen(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); !c.Attached(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("relay did not attach")
		}
	}
	return "ws://" + r.DownstreamAddr().String() + "/", func() { cancel(); <-done; c.Close() }
}
