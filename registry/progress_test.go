package registry

import (
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
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
	progress := serve(func(w http.ResponseWriter) io.Writer { return newCallerWriter(w, time.Minute, readRate{}) })
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

// pacedWriter is a caller that takes rate bytes a second and honours write deadlines as a socket
// does: a write that cannot finish by its deadline moves what it can and fails.
type pacedWriter struct {
	rate     int64     // set at construction
	deadline time.Time // set through SetWriteDeadline
	header   http.Header
}

func (p *pacedWriter) Header() http.Header { return p.header }
func (p *pacedWriter) WriteHeader(int)     {}
func (p *pacedWriter) SetWriteDeadline(t time.Time) error {
	p.deadline = t
	return nil
}

func (p *pacedWriter) Write(b []byte) (int, error) {
	need := time.Duration(float64(len(b)) / float64(p.rate) * float64(time.Second))
	n, err := len(b), error(nil)
	if !p.deadline.IsZero() && time.Now().Add(need).After(p.deadline) {
		need = max(time.Until(p.deadline), 0)
		n, err = min(int(float64(p.rate)*need.Seconds()), len(b)), os.ErrDeadlineExceeded
	}
	pass(need) // the caller takes its bytes at rate
	return n, err
}

// pass lets d go by on the bubble's clock: the one place these tests let time pass, and the time
// a caller's writes take is what they judge.
func pass(d time.Duration) { time.Sleep(d) }

// TestReadRateRule: the minimum read rate at its defaults, with synctest's clock. A caller is
// judged on the time its writes take, never on the relay's waits between them; one far below
// the rate is cut as the window ends, one just below it within a write of the window's end.
func TestReadRateRule(t *testing.T) {
	// feed writes 256 KiB at a time to a caller taking rate bytes a second, pausing between
	// writes, until it is cut or has taken total bytes; it reports how long that took.
	feed := func(rate, total int64, pause time.Duration) (cut bool, took time.Duration, cuts int) {
		start := time.Now()
		w := newCallerWriter(&pacedWriter{rate: rate, header: http.Header{}}, DefaultProgressTimeout,
			readRate{min: DefaultMinReadRate, window: DefaultReadRateWindow, cut: func() { cuts++ }})
		buf := make([]byte, bufferSize)
		for sent := int64(0); sent < total; sent += bufferSize {
			if _, err := w.Write(buf); err != nil {
				return err == errSlowReader && w.cut, time.Since(start), cuts
			}
			pass(pause) // the relay waits for the upstream: not the caller's time
		}
		return false, time.Since(start), cuts
	}
	synctest.Test(t, func(t *testing.T) {
		if cut, took, cuts := feed(5<<10, 64<<20, 0); !cut || took != DefaultReadRateWindow || cuts != 1 {
			t.Errorf("a caller taking 5 KiB/s: cut %v after %v (%d counted); want cut as its window ends, at %v",
				cut, took, cuts, DefaultReadRateWindow)
		}
		oneWrite := time.Duration(bufferSize) * time.Second / (60 << 10)
		if cut, took, _ := feed(60<<10, 64<<20, 0); !cut || took < DefaultReadRateWindow || took > DefaultReadRateWindow+oneWrite {
			t.Errorf("a caller taking 60 KiB/s: cut %v after %v; want cut within one write of %v", cut, took, DefaultReadRateWindow)
		}
		if cut, took, _ := feed(70<<10, 20<<20, 0); cut {
			t.Errorf("a caller taking 70 KiB/s was cut after %v", took)
		}
		// 70 KiB/s while it reads, but the relay has a write for it only every 10 s: 25 KiB/s of
		// wall time, all of it the upstream's pace.
		if cut, took, _ := feed(70<<10, 8<<20, 10*time.Second); cut {
			t.Errorf("a caller of a slow upstream was cut after %v", took)
		}
	})
}
