package registry

import (
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkServeFile measures what progress deadlines cost on the cache-hit path: a 64 MiB file
// served by sendfile over loopback straight from the ResponseWriter (plain) and through
// callerWriter (progress), alternately within each iteration so that both see the same load. It
// reports each one's throughput and progress/plain, the ratio of their times.
func BenchmarkServeFile(b *testing.B) {
	const size = 64 << 20
	path := filepath.Join(b.TempDir(), "object")
	blob := make([]byte, size)
	rand.Read(blob)
	if err := os.WriteFile(path, blob, 0o600); err != nil {
		b.Fatal(err)
	}
	serve := func(wrap func(http.ResponseWriter) io.Writer) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f, err := os.Open(path)
			if err != nil {
				b.Error(err)
				return
			}
			defer f.Close()
			w.Header().Set("Content-Length", "67108864")
			io.Copy(wrap(w), io.LimitReader(f, size))
		}))
		b.Cleanup(srv.Close)
		return srv
	}
	plain := serve(func(w http.ResponseWriter) io.Writer { return w })
	progress := serve(func(w http.ResponseWriter) io.Writer { return newCallerWriter(w, time.Minute) })
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	buf := make([]byte, 256<<10)
	get := func(url string) time.Duration {
		start := time.Now()
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.CopyBuffer(io.Discard, resp.Body, buf)
		resp.Body.Close()
		if n != size {
			b.Fatalf("read %d bytes", n)
		}
		return time.Since(start)
	}
	var tPlain, tProgress time.Duration
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 { // alternate which goes first
			tPlain += get(plain.URL)
			tProgress += get(progress.URL)
		} else {
			tProgress += get(progress.URL)
			tPlain += get(plain.URL)
		}
	}
	b.ReportMetric(float64(b.N)*size/(1<<20)/tPlain.Seconds(), "plain-MiB/s")
	b.ReportMetric(float64(b.N)*size/(1<<20)/tProgress.Seconds(), "progress-MiB/s")
	b.ReportMetric(tProgress.Seconds()/tPlain.Seconds(), "progress/plain")
}
