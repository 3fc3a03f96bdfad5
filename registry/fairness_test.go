package registry_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"code.foss.global/serve.zone/relay/registry"
)

// Issue 23 ("no byte outside the budget, no descriptor outside the limit"), the /v2/ slow
// readers: GETs with a query bypass the cache and held an upstream connection for as long as
// their caller read, and about 5 KB/s kept one alive. Eight such callers held a pool of eight,
// an honest pull timed out, and cache hits, which need an authorization HEAD from the same pool,
// waited with it. SPEC §15 "/v2/ fairness": upstream fetches are bounded per source address and
// in all, a wait for one is bounded (then 503 with Retry-After), the authorization HEADs have
// slots of their own, and a caller reading slower than 64 KiB/s for 30 s is cut.

// pushBlob uploads blob to repo on the upstream as alice, in one monolithic POST (no gzip of a
// random image: a big blob costs only its bytes), and returns its digest.
func pushBlob(t testing.TB, up *testUpstream, repo string, size int) string {
	t.Helper()
	blob := make([]byte, size)
	rand.Read(blob)
	digest := sha256Of(blob)
	req, _ := http.NewRequest(http.MethodPost, up.URL()+"/v2/"+repo+"/blobs/uploads/?digest="+digest, bytes.NewReader(blob))
	req.Header.Set("Authorization", "Bearer "+up.tokenFor(t, "alice", "alice-secret-pw"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("push blob: status %d", resp.StatusCode)
	}
	return digest
}

// slowReader is a caller that sends one GET from its own loopback address and reads the answer
// 4 KiB at a time with 200 ms pauses (20 KiB/s), through a narrow receive buffer (4 KiB, an
// Ethernet-sized MSS: loopback's 64 KiB segments would let the relay's kernel buffer megabytes
// for it). It is the pace that used to hold an upstream connection for as long as it liked.
type slowReader struct {
	conn   net.Conn
	stop   chan struct{} // closed by close
	hurry  chan struct{} // closed by readFast
	exited chan struct{} // closed when run returns
	headed chan struct{} // closed once status, retryAfter and body are set
	ended  chan slowEnd  // one value: how reading ended

	status     int    // set before headed is closed
	retryAfter string // set before headed is closed
	body       string // set before headed is closed: a refusal's body ("" for a 200)
	once       sync.Once
}

type slowEnd struct {
	n   int64 // body bytes read
	err error // why reading stopped: nil only for a refusal's whole body
}

var errStopped = errors.New("the test stopped reading")

func startSlowReader(t *testing.T, e *relayEnv, source, path, token string) *slowReader {
	t.Helper()
	d := dialerFrom(source)
	d.Control = func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = errors.Join(syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096),
				syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 1400))
		})
		return errors.Join(err, serr)
	}
	c, err := d.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &slowReader{conn: c, stop: make(chan struct{}), hurry: make(chan struct{}), exited: make(chan struct{}),
		headed: make(chan struct{}), ended: make(chan slowEnd, 1)}
	t.Cleanup(s.close)
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer "+token+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	go s.run()
	return s
}

func (s *slowReader) run() {
	defer close(s.exited)
	resp, err := http.ReadResponse(bufio.NewReaderSize(s.conn, 4<<10), nil)
	if err != nil {
		close(s.headed)
		s.ended <- slowEnd{err: err}
		return
	}
	defer resp.Body.Close()
	s.status, s.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
	if resp.StatusCode != http.StatusOK {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		s.body = string(b)
		close(s.headed)
		s.ended <- slowEnd{n: int64(len(b)), err: err}
		return
	}
	close(s.headed)
	buf := make([]byte, 4<<10)
	var n int64
	for {
		select { // the caller's pace, not a wait of the test's
		case <-s.stop:
			s.ended <- slowEnd{n: n, err: errStopped}
			return
		case <-s.hurry:
		case <-time.After(200 * time.Millisecond):
		}
		k, err := resp.Body.Read(buf)
		n += int64(k)
		if err != nil {
			s.ended <- slowEnd{n: n, err: err}
			return
		}
	}
}

// answered reports whether the answer's head has arrived, and its status.
func (s *slowReader) answered() (int, bool) {
	select {
	case <-s.headed:
		return s.status, true
	default:
		return 0, false
	}
}

// readFast makes the reader take the rest at once: once the relay has cut it, what the kernel still
// buffers for it need not be drained at 20 KiB/s before it sees the answer break off.
func (s *slowReader) readFast() { close(s.hurry) }

func (s *slowReader) close() {
	s.once.Do(func() { close(s.stop); s.conn.Close() })
	<-s.exited
}

// TestReadRate: a caller is judged by how fast it takes what the relay has for it, never by how
// fast the upstream sends.
func TestReadRate(t *testing.T) {
	t.Run("a caller reading slower than the minimum rate is cut", func(t *testing.T) {
		up := newTestUpstream(t, testUsers)
		// A 1 s window at 1 MiB/s stands in for 30 s at 64 KiB/s: a window's due (1 MiB) is
		// beyond what one write moves (256 KiB), as 1.875 MiB is, so the cut comes as it ends.
		e := startRelay(t, up.URL(), "", func(o *registry.Options) { o.MinReadRate, o.ReadRateWindow = 1<<20, time.Second })
		const size = 32 << 20
		big := pushBlob(t, up, "team/app", size)
		tok := up.tokenFor(t, "alice", "alice-secret-pw")
		s := startSlowReader(t, e, "127.0.0.1", "/v2/team/app/blobs/"+big+"?slow", tok)
		e.Eventually("the slow reader is cut", func() bool { return e.Metric("relay_registry_slow_readers_cut_total") == 1 })
		e.Eventually("the cut caller's upstream request is released", func() bool { return up.inflight.Load() == 0 })
		s.readFast()
		var end slowEnd
		select {
		case end = <-s.ended:
		case <-time.After(10 * time.Second): // a bound on failure only
			t.Fatal("10s after the relay cut it, the slow reader is still reading its answer")
		}
		if end.err == nil || errors.Is(end.err, errStopped) || end.n >= size {
			t.Fatalf("the slow reader's answer ended with %v after %d bytes", end.err, end.n)
		}
		if st, _ := s.answered(); st != http.StatusOK {
			t.Fatalf("the slow reader was answered %d", st)
		}
	})
	// A hit goes to its caller by sendfile (callerWriter.ReadFrom); the rule is the same.
	t.Run("a slow reader of a stored object is cut", func(t *testing.T) {
		up := newTestUpstream(t, testUsers)
		e := startRelay(t, up.URL(), "", func(o *registry.Options) { o.MinReadRate, o.ReadRateWindow = 1<<20, time.Second })
		const size = 32 << 20
		big := pushBlob(t, up, "team/app", size)
		tok := up.tokenFor(t, "alice", "alice-secret-pw")
		if resp, body, err := rawGet(t, e, http.MethodGet, "/v2/team/app/blobs/"+big, tok, nil); err != nil ||
			resp.StatusCode != http.StatusOK || sha256Of(body) != big {
			t.Fatalf("fill: %v %v", resp.StatusCode, err)
		}
		e.settle()
		s := startSlowReader(t, e, "127.0.0.1", "/v2/team/app/blobs/"+big, tok)
		e.Eventually("the slow reader of a hit is cut", func() bool { return e.Metric("relay_registry_slow_readers_cut_total") == 1 })
		s.readFast()
		var end slowEnd
		select {
		case end = <-s.ended:
		case <-time.After(10 * time.Second): // a bound on failure only
			t.Fatal("10s after the relay cut it, the slow reader is still reading its answer")
		}
		if end.err == nil || errors.Is(end.err, errStopped) || end.n >= size {
			t.Fatalf("the slow reader's answer ended with %v after %d bytes", end.err, end.n)
		}
		if got := e.Metric("relay_registry_cache_hits_total", "kind", "blob"); got != 1 {
			t.Fatalf("blob hits = %v: the slow reader was not served from the cache", got)
		}
	})
	t.Run("a caller of a slow upstream is not cut", func(t *testing.T) {
		up := newTestUpstream(t, testUsers)
		e := startRelay(t, up.URL(), "", func(o *registry.Options) { o.MinReadRate, o.ReadRateWindow = 1<<20, 100*time.Millisecond })
		blob := pushBlob(t, up, "team/app", 64<<10)
		tok := up.tokenFor(t, "alice", "alice-secret-pw")
		up.bytesPerSec.Store(32 << 10) // 2 s for the blob: far below the minimum rate, for 20 windows
		for _, path := range []string{"/v2/team/app/blobs/" + blob + "?forwarded", "/v2/team/app/blobs/" + blob} {
			resp, body, err := rawGet(t, e, http.MethodGet, path, tok, nil)
			if err != nil || resp.StatusCode != http.StatusOK || sha256Of(body) != blob {
				t.Fatalf("%s from a slow upstream: %v %v, %d bytes", path, resp.StatusCode, err, len(body))
			}
		}
		if got := e.Metric("relay_registry_slow_readers_cut_total"); got != 0 {
			t.Fatalf("slow readers cut = %v: a caller was cut for the upstream's pace", got)
		}
	})
}
