// Package platformbench measures the Corestore platform agent's database closures (docs/platform.md):
// a backup's throughput Corestore → relay → Cloudly against the same peers direct, in the same
// run, and the relay's peak RSS while it carries 4 closures at once, at two closure sizes.
//
// The relay is a process of its own (`relay run`, built from ./cmd/relay), so its RSS is its
// own; the simulated Cloudly and Corestores run in the benchmark's process. The direct baseline is
// a writer in the benchmark's process doing what the relay does — GET the closure from Corestore,
// write it to Cloudly as a VirtualStream, chunk by chunk, each chunk answered before the next —
// on its own socket to the same Cloudly.
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/platform/
package platformbench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/interop"
	"code.foss.global/serve.zone/relay/testenv/await"
	"code.foss.global/serve.zone/relay/testenv/sim"
)

const chunkBytes = 256 << 10 // the agent's default

// env is the sim Cloudly, n sim Corestores (node-0 … node-n-1), and a relay process attached;
// and one more Corestore the relay is not told of, for the direct baseline.
type env struct {
	cloudly  *sim.Cloudly
	stores   []*sim.Corestore
	alone    *sim.Corestore
	baseline *sim.Cloudly // the baseline's: the same stand-in, another instance, so its socket never displaces the relay's
	relay    *interop.Relay
}

func start(b *testing.B, n int) *env {
	b.Helper()
	e := &env{}
	var err error
	if e.cloudly, err = sim.NewCloudly(zerolog.Nop()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.cloudly.Close)
	if e.baseline, err = sim.NewCloudly(zerolog.Nop()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.baseline.Close)
	e.baseline.AcceptNodesDirectly() // the baseline's socket opens no client session
	var origins []contracts.CorestoreOrigin
	for i := range n {
		cs := sim.NewCorestore(sim.CorestoreOptions{NodeName: fmt.Sprint("node-", i), Plaintext: true})
		b.Cleanup(cs.Close)
		cred := "bench-credential-" + strconv.Itoa(i)
		cs.Platform().SetBearer(cred)
		e.cloudly.Platform().SetCredential(fmt.Sprint("node-", i), cred)
		origins = append(origins, contracts.CorestoreOrigin{NodeID: fmt.Sprint("node-", i), Origin: cs.Origin()})
		e.stores = append(e.stores, cs)
	}
	e.alone = sim.NewCorestore(sim.CorestoreOptions{NodeName: "node-direct", Plaintext: true})
	b.Cleanup(e.alone.Close)
	e.alone.Platform().SetBearer("bench-credential-direct")
	e.cloudly.SetCorestores(origins)
	e.cloudly.Platform().SetDesiredState([]byte(`{"capabilities":{},"providerConfigs":[],"bindings":[]}`))
	dir := b.TempDir()
	wd, _ := os.Getwd()
	bin, err := interop.RelayBinary(context.Background(), filepath.Join(wd, "..", "..", "interop"), dir)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.relay, err = interop.StartRelay(ctx, interop.RelayConfig{Bin: bin, CloudlyURL: e.cloudly.URL(), ClusterID: e.cloudly.ClusterID,
		Token: e.cloudly.Token, WorkDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.relay.Stop)
	if err := e.cloudly.WaitAttached(ctx); err != nil {
		b.Fatal(err)
	}
	await.Until(b, "the credentials pushed", time.Minute, func() bool { return e.cloudly.Platform().CredentialsPushed() >= int64(n) })
	return e
}

// through has the relay carry one backup of size bytes from each of the first k Corestores at
// once, and returns the time from the first closure byte reaching Cloudly to the last backup
// accepted (the 30 s listing cadence and the reconnect that skips it are not the relay's
// throughput), and the relay's peak RSS meanwhile.
func (e *env) through(b *testing.B, k int, size int64, tag string) (time.Duration, int64) {
	b.Helper()
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if rss, err := e.relay.RSS(); err == nil && rss > peak.Load() {
				peak.Store(rss)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	before := make([]int64, k)
	for i := range k {
		before[i] = e.stores[i].Platform().Delivered()
	}
	for i := range k {
		e.stores[i].Platform().AddBackup(tag+strconv.Itoa(i), sim.PlatformClosure{ServiceID: "svc-bench", Size: size})
	}
	// The measurement starts at the first stream frame Cloudly reads (a chunk of one of the
	// backups: nothing else streams meanwhile).
	var begin time.Time
	var once sync.Once
	started := make(chan struct{})
	e.cloudly.TapStreams(func([]byte) { once.Do(func() { begin = time.Now(); close(started) }) })
	defer e.cloudly.TapStreams(nil)
	// The agent lists every 30 s: a reconnect makes it list now.
	e.cloudly.Drop()
	deadline := time.Now().Add(10 * time.Minute)
	select {
	case <-started:
	case <-time.After(time.Until(deadline)):
		b.Fatalf("no backup started: %s", e.relay.Log())
	}
	for i := range k {
		if !await.Within(time.Until(deadline), func() bool { return e.stores[i].Platform().Delivered() > before[i] }) {
			b.Fatalf("backup %d not delivered: %s", i, e.relay.Log())
		}
	}
	elapsed := time.Since(begin)
	close(stop)
	<-sampled
	for i := range k {
		if rc, _ := e.cloudly.Platform().Received(tag + strconv.Itoa(i)); rc.Bytes != size || rc.Sum != sim.ClosureDigest(tag+strconv.Itoa(i), size) {
			b.Fatalf("backup %d arrived as %d bytes", i, rc.Bytes)
		}
	}
	return elapsed, peak.Load()
}

// direct carries one backup of size bytes from the lone Corestore to Cloudly without the relay: the
// same GET, the same frames, the same chunk-by-chunk answers, on a socket of its own.
func (e *env) direct(b *testing.B, size int64, id string) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e.alone.Platform().AddBackup(id, sim.PlatformClosure{ServiceID: "svc-bench", Size: size})
	answers := make(chan contracts.StreamFrameBody, 64)
	ws, _, err := websocket.Dial(ctx, e.baseline.URL(), nil)
	if err != nil {
		b.Fatal(err)
	}
	conn := typedsocket.New(ws, typedsocket.Options{ReadLimit: 64 << 20, Logger: zerolog.Nop(),
		Streams: typedsocket.StreamHandlerFunc(func(_ *typedsocket.Conn, f *typedsocket.StreamFrame) {
			if body, err := contracts.ReadStreamFrameBody(f.Frame); err == nil {
				answers <- body
			}
		})})
	go conn.Run(context.Background())
	defer conn.CloseNow()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.alone.Origin()+contracts.CorestoreBackupsPrefix+id+"/closure", nil)
	req.Header.Set("Authorization", "Bearer bench-credential-direct")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	b2, _ := e.alone.Platform().Backup(id)
	stream := "direct-" + id
	call := make(chan typedsocket.Reply, 1)
	body := contracts.BackupClosureRequest{BackupID: id, ServiceID: "svc-bench", NodeID: "node-0", Descriptor: b2.Descriptor, StreamID: stream}.Encode()
	if _, err := conn.CallAsync(contracts.MethodBackupServiceDatabaseClosure, body, func(r typedsocket.Reply) { call <- r }, typedsocket.Timeout(10*time.Minute)); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, chunkBytes)
	var frames [2][]byte
	var begin time.Time // the first chunk leaves: timed as the relay is
	for k := 0; ; k++ {
		m, rerr := io.ReadFull(resp.Body, buf)
		last := rerr != nil
		cycle := stream + "-" + strconv.Itoa(k)
		frames[k%2] = contracts.AppendChunkFrame(frames[k%2][:0], stream, cycle, buf[:m], !last, last && m == 0)
		if m == 0 && !last {
			continue
		}
		if err := conn.SendFrame(frames[k%2]); err != nil {
			b.Fatal(err)
		}
		if k == 0 {
			begin = time.Now()
		}
		<-answers
		if last {
			if m > 0 {
				conn.SendFrame(contracts.AppendChunkFrame(nil, stream, cycle+"-end", nil, false, true))
				<-answers
			}
			break
		}
	}
	r := <-call
	if r.Err != nil || string(r.Response) != `{"accepted":true}` {
		b.Fatalf("direct: %s %v", r.Response, r.Err)
	}
	if rc, _ := e.baseline.Platform().Received(id); rc.Bytes != size || rc.Sum != sim.ClosureDigest(id, size) {
		b.Fatalf("direct backup arrived as %d bytes", rc.Bytes)
	}
	return time.Since(begin)
}

func mbps(size int64, d time.Duration) float64 { return float64(size) / (1 << 20) / d.Seconds() }

// BenchmarkBackup200MiB: one 200 MiB backup direct and through the relay, three rounds each,
// alternating; the ratio is of the medians.
func BenchmarkBackup200MiB(b *testing.B) {
	const size = 200 << 20
	e := start(b, 1)
	var direct, relayed []float64
	for i := range 3 {
		direct = append(direct, mbps(size, e.direct(b, size, "d"+strconv.Itoa(i))))
		d, _ := e.through(b, 1, size, "r"+strconv.Itoa(i)+"-")
		relayed = append(relayed, mbps(size, d))
	}
	md, mr := median(direct), median(relayed)
	b.ReportMetric(md, "direct-MiB/s")
	b.ReportMetric(mr, "relay-MiB/s")
	b.ReportMetric(mr/md, "ratio")
	b.Logf("direct %.1f MiB/s %v; through the relay %.1f MiB/s %v; ratio %.2f", md, direct, mr, relayed, mr/md)
}

// BenchmarkFourClosuresRSS: 4 backups at once through the relay, at 50 MiB and at 200 MiB each;
// the relay's peak RSS at each size.
func BenchmarkFourClosuresRSS(b *testing.B) {
	e := start(b, 4)
	idle, _ := e.relay.RSS()
	for _, size := range []int64{50 << 20, 200 << 20} {
		d, peak := e.through(b, 4, size, fmt.Sprintf("s%d-", size>>20))
		b.ReportMetric(float64(peak)/(1<<20), fmt.Sprintf("peakRSS-MiB@4x%dMiB", size>>20))
		b.Logf("4 × %d MiB at once: %.1f s (%.1f MiB/s in all); relay RSS idle %.1f MiB, peak %.1f MiB",
			size>>20, d.Seconds(), mbps(4*size, d), float64(idle)/(1<<20), float64(peak)/(1<<20))
	}
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}
