package ingress_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/ingress"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

// Benchmarks of the route table server (results: bench/results/ingress.md). The end-to-end ones
// run the real relay with 100 sim ingress connections over loopback; client-side decoding of the
// answers runs on the same machine and is part of the figure.

const benchIngresses = 100

// table4MiB is a route table of about 4 MiB: many routes with PEM-sized certificate blobs.
func table4MiB(rev int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"revision":%d,"routes":[`, rev)
	cert := strings.Repeat("M", 3000)
	for i := 0; b.Len() < 4<<20-4000; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"hostname":"app-%d.example.com","target":"10.0.%d.%d:8080","certificate":"%s"}`, i, i/250%250, i%250, cert)
	}
	b.WriteString(`]}`)
	return b.String()
}

// benchIngressSet connects and registers n ingresses that neither pull on hints nor re-register,
// each calling onHint for every hint.
func benchIngressSet(b *testing.B, h *harness, n int, onHint func(int64)) []*sim.Ingress {
	b.Helper()
	ins := make([]*sim.Ingress, n)
	for i := range ins {
		node := fmt.Sprintf("ingress-%03d", i)
		h.control.Designate(node, "bearer-"+node)
		in := sim.NewIngress(node, "bearer-"+node, h.Log)
		in.AutoPull, in.AutoReregister, in.OnHint = false, false, onHint
		if err := in.Connect(h.ctx(), h.URL); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(in.Close)
		if _, err := in.Register(h.ctx()); err != nil {
			b.Fatal(err)
		}
		ins[i] = in
	}
	return ins
}

// BenchmarkRouteTableReads4MiB100Ingresses: getClusterIngressRouteTable answers per second with a
// 4 MiB table held, 100 ingress connections reading concurrently through the real relay.
func BenchmarkRouteTableReads4MiB100Ingresses(b *testing.B) {
	h := newHarness(b, harnessOptions{logLevel: zerolog.WarnLevel})
	ins := benchIngressSet(b, h, benchIngresses, nil)
	table := table4MiB(1)
	h.push(table)
	req := contracts.EncodeGetClusterIngressRouteTableRequest(-1)
	var next atomic.Int64
	var failed atomic.Value
	b.SetBytes(int64(len(table)))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for _, in := range ins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				resp, err := in.Call(h.ctx(), contracts.MethodGetClusterIngressRouteTable, req)
				if err != nil || len(resp) != len(table)+len(`{"table":}`) {
					failed.Store(fmt.Sprintf("read: %v (%d bytes)", err, len(resp)))
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if f := failed.Load(); f != nil {
		b.Fatal(f)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "reads/s")
}

// BenchmarkHintFanout100Ingresses: from Cloudly's pushClusterRouteTable to the hint having
// reached all 100 ingress connections (a small table, so the figure is the fan-out).
func BenchmarkHintFanout100Ingresses(b *testing.B) {
	h := newHarness(b, harnessOptions{logLevel: zerolog.WarnLevel})
	var mu sync.Mutex
	var want int64
	var got int
	all := make(chan struct{}, 1)
	benchIngressSet(b, h, benchIngresses, func(rev int64) {
		mu.Lock()
		defer mu.Unlock()
		if rev == want {
			if got++; got == benchIngresses {
				all <- struct{}{}
			}
		}
	})
	b.ReportAllocs()
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		mu.Lock()
		want, got = int64(i), 0
		mu.Unlock()
		if _, err := h.control.PushTable(h.ctx(), json.RawMessage(fmt.Sprintf(`{"revision":%d,"routes":[]}`, i))); err != nil {
			b.Fatal(err)
		}
		select {
		case <-all:
		case <-time.After(10 * time.Second):
			b.Fatalf("revision %d reached %d of %d ingresses", i, got, benchIngresses)
		}
	}
}

// benchFakePeer answers nothing and costs nothing: the in-process benchmarks measure the server.
type benchFakePeer struct{ id uint64 }

func (p benchFakePeer) ID() uint64 { return p.id }
func (p benchFakePeer) Call(_ string, _ json.RawMessage, done func(json.RawMessage, error)) {
	done(json.RawMessage(`{}`), nil)
}

type benchUpstream struct{}

func (benchUpstream) Attached() bool { return true }
func (benchUpstream) Call(method string, _ json.RawMessage, done func(json.RawMessage, error)) {
	if method == contracts.MethodGetClusterRouteTable {
		done(json.RawMessage(`{"table":null}`), nil)
		return
	}
	done(json.RawMessage(`{"accepted":true,"revision":null,"protocol":{}}`), nil)
}

// BenchmarkRouteTableServeInProcess: the server's own cost of one read of a 4 MiB table (no
// sockets): the answer is encoded once per revision and handed out without a copy.
func BenchmarkRouteTableServeInProcess(b *testing.B) {
	s, err := ingress.New(ingress.Options{})
	if err != nil {
		b.Fatal(err)
	}
	s.Attached(benchUpstream{})
	peers := make([]benchFakePeer, benchIngresses)
	for i := range peers {
		peers[i] = benchFakePeer{uint64(i + 1)}
		body := contracts.EncodeClusterIngressRegistration(contracts.ClusterIngressRegistration{
			Bearer: contracts.NewSecret("b"), Version: "3.0.0", NodeID: fmt.Sprintf("n%d", i), Protocol: contracts.RelayOffer})
		s.Register(peers[i], body, func(json.RawMessage, error) {})
	}
	if _, err := s.PushRouteTable(json.RawMessage(`{"table":` + table4MiB(1) + `}`)); err != nil {
		b.Fatal(err)
	}
	req := contracts.EncodeGetClusterIngressRouteTableRequest(1)
	var i atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		p := peers[i.Add(1)%benchIngresses]
		for pb.Next() {
			if _, err := s.RouteTable(p, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkHintFanoutInProcess: the server's own cost of applying a newer table and handing the
// hint to 100 connections (each peer's Call returns at once).
func BenchmarkHintFanoutInProcess(b *testing.B) {
	s, err := ingress.New(ingress.Options{})
	if err != nil {
		b.Fatal(err)
	}
	s.Attached(benchUpstream{})
	for i := range benchIngresses {
		body := contracts.EncodeClusterIngressRegistration(contracts.ClusterIngressRegistration{
			Bearer: contracts.NewSecret("b"), Version: "3.0.0", NodeID: fmt.Sprintf("n%d", i), Protocol: contracts.RelayOffer})
		s.Register(benchFakePeer{uint64(i + 1)}, body, func(json.RawMessage, error) {})
	}
	bodies := make([]json.RawMessage, b.N)
	for i := range bodies {
		bodies[i] = json.RawMessage(fmt.Sprintf(`{"table":{"revision":%d,"routes":[]}}`, i+1))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := s.PushRouteTable(bodies[i]); err != nil {
			b.Fatal(err)
		}
	}
}
