// Package registrybench measures image pulls through the relay's registry forwarding against
// pulls straight from the registry, in the same run (README.md#measuring-it style; results in
// bench/results/registry.md).
//
//	go test -run '^$' -bench BenchmarkPull200MiB -benchtime 1x ./bench/registry/
package registrybench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/prometheus/client_golang/prometheus"

	"code.foss.global/serve.zone/relay/registry"
	"code.foss.global/serve.zone/relay/relay"
	"code.foss.global/serve.zone/relay/testenv/relaytest"
)

const (
	blobSize = 200 << 20
	pullers  = 10
	repo     = "bench/image"
)

// fileBlobs serves blobs from files named by their digest. go-containerregistry's disk handler
// re-hashes the whole blob on every HEAD and GET, which would charge each request 200 MiB of
// hashing on this 2-core machine; a registry answers from its metadata.
type fileBlobs struct{ dir string }

func (f fileBlobs) path(h v1.Hash) string { return filepath.Join(f.dir, h.Algorithm, h.Hex) }

func (f fileBlobs) Stat(_ context.Context, _ string, h v1.Hash) (int64, error) {
	st, err := os.Stat(f.path(h))
	if errors.Is(err, os.ErrNotExist) {
		return 0, ggcrregistry.ErrNotFound
	}
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

func (f fileBlobs) Get(_ context.Context, _ string, h v1.Hash) (io.ReadCloser, error) {
	rc, err := os.Open(f.path(h))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ggcrregistry.ErrNotFound
	}
	return rc, err
}

// writeBlob writes blobSize random bytes into dir as a blob and returns its digest.
func writeBlob(b *testing.B, dir string) v1.Hash {
	tmp := filepath.Join(dir, "incoming")
	f, err := os.Create(tmp)
	if err != nil {
		b.Fatal(err)
	}
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(f, h), rand.Reader, blobSize); err != nil {
		b.Fatal(err)
	}
	f.Close()
	d := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	os.MkdirAll(filepath.Join(dir, "sha256"), 0o755)
	if err := os.Rename(tmp, filepath.Join(dir, "sha256", d.Hex)); err != nil {
		b.Fatal(err)
	}
	return d
}

// link paces writes on every connection of a listener through one shared budget: the cluster's
// uplink to the registry. Zero rate: no pacing (and the server keeps sendfile).
type link struct {
	rate float64 // bytes per second

	mu   sync.Mutex
	next time.Time // guarded by mu: when the link is free again
	sent atomic.Int64
}

func (l *link) wait(n int) {
	const burst = 20 * time.Millisecond // a sleep overshoots; the budget it misses is not lost
	l.mu.Lock()
	now := time.Now()
	if l.next.Before(now.Add(-burst)) {
		l.next = now.Add(-burst)
	}
	l.next = l.next.Add(time.Duration(float64(n) / l.rate * float64(time.Second)))
	until := l.next
	l.mu.Unlock()
	time.Sleep(time.Until(until)) // the link's rate: the wait is the behaviour
}

type shapedListener struct {
	net.Listener
	l *link
}

func (s shapedListener) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return shapedConn{c, s.l}, nil
}

type shapedConn struct {
	net.Conn
	l *link
}

func (c shapedConn) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), 64<<10)]
		c.l.wait(len(chunk))
		w, err := c.Conn.Write(chunk)
		n += w
		c.l.sent.Add(int64(w))
		if err != nil {
			return n, err
		}
		p = p[w:]
	}
	return n, nil
}

// startUpstream serves the blob directory as a registry, behind the link when it has a rate.
func startUpstream(b *testing.B, dir string, l *link) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)),
		ggcrregistry.WithBlobHandler(fileBlobs{dir}))}
	var served net.Listener = ln
	if l.rate > 0 {
		served = shapedListener{ln, l}
	}
	go srv.Serve(served)
	b.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// startRelay runs a real relay (testenv/relaytest: downstream listener, simulated Cloudly)
// forwarding to upstream with a fresh cache directory; stop shuts it down and removes the directory.
func startRelay(b *testing.B, upstream string) (addr string, prom *prometheus.Registry, stop func()) {
	dir, err := os.MkdirTemp("", "relay-bench-")
	if err != nil {
		b.Fatal(err)
	}
	e := relaytest.Start(b, relaytest.Options{Quiet: true,
		Configure: func(cfg *relay.Config) { cfg.RegistryUpstream = upstream },
		Build: func(cfg relay.Config, o relay.Options) (*relay.Relay, error) {
			reg, err := registry.New(registry.Options{Upstream: cfg.RegistryUpstream, CacheDir: filepath.Join(dir, "cache"),
				CacheMaxBytes: 10 << 30, Registerer: o.Registry})
			if err != nil {
				return nil, err
			}
			return relay.New(cfg, relay.Features{Registry: reg}, o)
		},
	})
	var once sync.Once
	stop = func() { once.Do(func() { e.Close(); os.RemoveAll(dir) }) }
	b.Cleanup(stop)
	return e.Relay.DownstreamAddr().String(), e.Registry, stop
}

// pull GETs the blob and hashes it as a pulling client does, checking the digest.
func pull(base string, d v1.Hash) error {
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(base + "/v2/" + repo + "/blobs/" + d.String())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	if err != nil {
		return err
	}
	if n != blobSize || hex.EncodeToString(h.Sum(nil)) != d.Hex {
		return fmt.Errorf("got %d bytes with the wrong digest", n)
	}
	return nil
}

// phase runs n concurrent pulls and returns their aggregate throughput in MiB/s.
func phase(b *testing.B, base string, d v1.Hash, n int) float64 {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	for range n {
		wg.Go(func() { errs <- pull(base, d) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return float64(n) * blobSize / (1 << 20) / elapsed.Seconds()
}

func counter(b *testing.B, prom *prometheus.Registry, name string) float64 {
	mfs, err := prom.Gather()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// rounds: the machine is shared, so each figure is the median of three rounds, each round
// measuring every case once, one after another.
const rounds = 3

// BenchmarkPull200MiB pulls one 200 MiB blob straight from the registry and through the relay,
// cold (empty cache) and warm, with 1 and 10 concurrent pullers, on plain loopback and behind a
// shared 1 Gbit/s link that stands for the cluster's uplink to the registry.
func BenchmarkPull200MiB(b *testing.B) {
	blobDir := b.TempDir() // removed when the benchmark ends
	d := writeBlob(b, blobDir)
	for _, lc := range []struct {
		name string
		rate float64
	}{{"loopback", 0}, {"uplink=1Gbps", 125e6}} {
		b.Run(lc.name, func(b *testing.B) {
			l := &link{rate: lc.rate}
			up := startUpstream(b, blobDir, l)
			var direct1, direct10, cold1, cold10, warm10 []float64
			for b.Loop() {
				for range rounds {
					direct1 = append(direct1, phase(b, up, d, 1))
					relay1, _, stop1 := startRelay(b, up)
					cold1 = append(cold1, phase(b, "http://"+relay1, d, 1))
					stop1()

					direct10 = append(direct10, phase(b, up, d, pullers))
					relay10, prom, stop10 := startRelay(b, up)
					sent := l.sent.Load()
					cold10 = append(cold10, phase(b, "http://"+relay10, d, pullers))
					coldUpstream := l.sent.Load() - sent
					warm10 = append(warm10, phase(b, "http://"+relay10, d, pullers))
					if misses := counter(b, prom, "relay_registry_cache_misses_total"); misses != 1 {
						b.Fatalf("%v upstream fetches for one digest", misses)
					}
					stop10()
					if lc.rate > 0 {
						b.Logf("cold, %d pullers: the upstream sent %.1f MiB", pullers, float64(coldUpstream)/(1<<20))
					}
				}
			}
			m1, m10, c1, c10, w10 := median(direct1), median(direct10), median(cold1), median(cold10), median(warm10)
			b.ReportMetric(m1, "direct1-MiB/s")
			b.ReportMetric(m10, "direct10-MiB/s")
			b.ReportMetric(c1, "cold1-MiB/s")
			b.ReportMetric(c10, "cold10-MiB/s")
			b.ReportMetric(w10, "warm10-MiB/s")
			b.ReportMetric(c1/m1, "cold1/direct1")
			b.ReportMetric(c10/m10, "cold10/direct10")
			b.ReportMetric(w10/c10, "warm10/cold10")
			b.ReportMetric(w10/c1, "warm10/cold1")
			b.Logf("%s, MiB/s aggregate per round: direct1 %.0f, cold1 %.0f, direct10 %.0f, cold10 %.0f, warm10 %.0f",
				lc.name, direct1, cold1, direct10, cold10, warm10)
		})
	}
}
