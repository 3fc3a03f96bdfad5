package escrow

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"code.foss.global/serve.zone/relay/contracts"
)

// benchRun builds a realistic hold request for node: 23 fifteen-minute-or-shorter windows, an
// authority revision reference, and an Ed25519-sized signature (64 bytes, base64url: 86
// characters), so the raw size is what Cloudly would send. It also returns the node's answer to
// each renewal, so that the simulated node spends no time building it.
func benchRun(tb testing.TB, node string, start time.Time, step, window time.Duration) (json.RawMessage, []json.RawMessage) {
	tb.Helper()
	h := &contracts.HoldRuntimeNetworkDnsLeaseRenewalsRequest{NodeID: node, Projection: contracts.ProjectionReference{
		ID: "projection-" + node, Generation: 41, Digest: contracts.Digest("bench", []byte(`"`+node+`"`))}}
	sig := make([]byte, 64)
	var answers []json.RawMessage
	for i := range 23 {
		slot := start.Add(time.Duration(i) * step).UnixMilli()
		r, err := contracts.SealRuntimeNetworkDnsLeaseRenewal(contracts.RuntimeNetworkDnsLeaseRenewal{
			Controller: json.RawMessage(`{"kind":"cloudly","id":"cloudly-prod-1"}`), NodeID: node,
			RuntimeNamespace: "rt-cluster-prod-7", Projection: h.Projection, Sequence: int64(1000 + i),
			Dns: contracts.DnsWindow{IssuedAt: slot, NotBefore: slot, ExpiresAt: slot + window.Milliseconds()},
		})
		if err != nil {
			tb.Fatal(err)
		}
		answers = append(answers, json.RawMessage(`{"status":"accepted","renewal":{"projection":`+
			string(h.Projection.AppendJSON(nil))+`,"sequence":`+fmt.Sprint(r.Sequence)+`,"digest":"`+r.Digest+`"}}`))
		sig[0], sig[1] = byte(i), byte(len(node))
		h.Renewals = append(h.Renewals, contracts.SignedRuntimeNetworkDnsLeaseRenewal{
			Authority: json.RawMessage(`{"id":"authority-cloudly-prod-1","revision":12}`), Renewal: r,
			Signature: json.RawMessage(`"` + base64.RawURLEncoding.EncodeToString(sig) + `"`),
		})
	}
	return h.AppendJSON(nil), answers
}

// benchNode records when each push arrives and answers it from another goroutine, as a socket
// reader would, with the answer prepared for the k-th push.
type benchNode struct {
	*fakeNode
	queue    chan<- func()
	answers  []json.RawMessage
	pushes   atomic.Int64
	received *[]time.Time // one per push, across all nodes
	mu       *sync.Mutex
}

// processCPU is the user and system CPU time the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (n *benchNode) Call(method string, body json.RawMessage, done func(json.RawMessage, error)) {
	at := time.Now()
	n.mu.Lock()
	*n.received = append(*n.received, at)
	n.mu.Unlock()
	answer := n.answers[n.pushes.Add(1)-1]
	n.queue <- func() { done(answer, nil) }
}

// BenchmarkEscrow10kNodes holds 23 renewals for each of 10 000 carried nodes and reports the
// heap they take against the raw JSON Cloudly sent (target ≤ 1.5×), then detaches and reports
// the release delay — from a slot opening to the push reaching the node's connection — over
// three slots that open for every node at the same instant (the intended grid makes them
// coincide), p50 and p99 (target p99 ≤ 50 ms). Run it once: -bench Escrow10k -benchtime 1x.
func BenchmarkEscrow10kNodes(b *testing.B) {
	const nodes = 10_000
	for range b.N {
		e, err := New(Options{Registerer: prometheus.NewRegistry()})
		if err != nil {
			b.Fatal(err)
		}
		answers := make(chan func(), nodes)
		var answerers sync.WaitGroup
		for range 2 {
			answerers.Add(1)
			go func() {
				defer answerers.Done()
				for f := range answers {
					f()
				}
			}()
		}
		var mu sync.Mutex
		var received []time.Time
		ids := make([]string, nodes)
		carriers := make([]*benchNode, nodes)
		e.Attached(nil)
		for i := range ids {
			ids[i] = fmt.Sprintf("node-%05d", i)
			carriers[i] = &benchNode{fakeNode: newFakeNode(ids[i], json.RawMessage(`{"kind":"cloudly","id":"cloudly-prod-1"}`), "rt-cluster-prod-7", 1),
				queue: answers, received: &received, mu: &mu}
			e.NodeBound(carriers[i])
		}

		// Memory: runs whose windows are far ahead, held one request at a time as they arrive.
		setup := time.Now()
		far := time.Now().Add(time.Hour)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		raw := 0
		for _, id := range ids {
			body, _ := benchRun(b, id, far, 10*time.Minute, 15*time.Minute)
			raw += len(body)
			if _, err := e.Hold(true, body); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
		holdTime := time.Since(setup)

		// Delay: replace every run with one whose slots open 2 s apart from t0, for all nodes at
		// once, detach before t0, and time three slot bursts.
		const step, bursts = 2 * time.Second, 3
		t0 := time.Now().Add(2*holdTime + 3*time.Second).Truncate(time.Second)
		for i, id := range ids {
			body, answers := benchRun(b, id, t0, step, 3*time.Second)
			carriers[i].answers = answers
			if _, err := e.Hold(true, body); err != nil {
				b.Fatal(err)
			}
		}
		if time.Until(t0) < 500*time.Millisecond {
			b.Fatalf("holding took too long: t0 is %v away", time.Until(t0))
		}
		ctx, cancel := context.WithCancel(context.Background())
		var ran atomic.Bool
		done := make(chan struct{})
		go func() { ran.Store(true); e.Run(ctx); close(done) }()
		e.Detached()
		// The CPU the releases cost is measured from now to the end of the wall-clock window they
		// are due in (until t0 the process only waits, which costs nothing): the wait to the
		// window's end is the measurement.
		cpu0 := processCPU()
		time.Sleep(time.Until(t0.Add(bursts*step - step/2)))
		cpu := processCPU() - cpu0
		cancel()
		<-done
		close(answers)
		answerers.Wait()

		mu.Lock()
		var delays []time.Duration
		for _, at := range received {
			k := at.Sub(t0) / step // the burst this push belongs to
			delays = append(delays, at.Sub(t0.Add(k*step)))
		}
		mu.Unlock()
		if len(delays) != nodes*bursts {
			b.Fatalf("%d pushes, want %d", len(delays), nodes*bursts)
		}
		slices.Sort(delays)
		p := func(q float64) float64 {
			return float64(delays[int(q*float64(len(delays)-1))]) / float64(time.Millisecond)
		}
		b.ReportMetric(float64(held)/float64(raw), "mem/raw")
		b.ReportMetric(float64(held)/nodes, "heldB/node")
		b.ReportMetric(float64(raw)/nodes, "rawB/node")
		b.ReportMetric(p(0.50), "p50-ms")
		b.ReportMetric(p(0.99), "p99-ms")
		b.ReportMetric(p(1), "max-ms")
		b.ReportMetric(holdTime.Seconds()/nodes*1e6, "hold-µs/node")
		// CPU the whole process spent per push during the bursts, answers included: what a burst
		// costs on a core of its own, whatever else the machine runs.
		b.ReportMetric(float64(cpu)/float64(time.Microsecond)/float64(len(delays)), "cpu-µs/push")
	}
}
