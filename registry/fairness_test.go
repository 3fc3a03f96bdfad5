package registry_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"code.foss.global/serve.zone/relay/registry"
)

// Before the budget bounded every byte (docs/hostile.md), the /v2/ slow
// readers: GETs with a query bypass the cache and held an upstream connection for as long as
// their caller read, and about 5 KB/s kept one alive. Eight such callers held a pool of eight,
// an honest pull timed out, and cache hits, which need an authorization HEAD from the same pool,
// waited with it. docs/hostile.md "/v2/ fairness": upstream fetches are bounded per source address and
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

// narrowDialer is dialerFrom(source) whose connections have a 4 KiB receive buffer and an
// Ethernet-sized MSS (1400 bytes): with loopback's 64 KiB segments the relay's kernel would buffer
// megabytes for a caller that reads slowly or not at all; with these, tens of KiB.
func narrowDialer(source string) *net.Dialer {
	d := dialerFrom(source)
	d.Control = func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = errors.Join(syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096),
				syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 1400))
		})
		return errors.Join(err, serr)
	}
	return d
}

func startSlowReader(t *testing.T, e *relayEnv, source, path, token string) *slowReader {
	t.Helper()
	c, err := narrowDialer(source).Dial("tcp", e.addr)
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

// refusedCount counts the readers whose answer came and was not a 200.
func refusedCount(rs []*slowReader) int {
	n := 0
	for _, s := range rs {
		if st, ok := s.answered(); ok && st != http.StatusOK {
			n++
		}
	}
	return n
}

// getFrom GETs path from the loopback address source within ctx and reports the answer's status
// and the digest of its body.
func getFrom(ctx context.Context, e *relayEnv, source, path, token string) (int, string, http.Header, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	tr := &http.Transport{DisableKeepAlives: true, DialContext: dialerFrom(source).DialContext}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, sha256Of(body), resp.Header, err
}

// slowBlobSendBuffer is the upstream's send buffer in tests whose slow reader must hold an
// upstream request (the handler still writing) for as long as it reads. With it, what the upstream
// has sent when a slow reader stops taking more — its send buffer (doubled by the kernel), what
// the relay's receive buffer took before the relay's 256 KiB copy blocked on the caller, the
// relay's send buffer and the reader's 4 KiB receive buffer (narrowDialer) — came to 1.0-1.1 MiB
// whatever the blob's size (measured on loopback with tcp_rmem 4096 131072 33554432), so a 4 MiB
// blob is far beyond every socket buffer on the way. Left to the kernel, loopback's send buffer
// grows to megabytes: the whole 4 MiB went, and the tests pushed 32 MiB.
const slowBlobSendBuffer = 64 << 10

// Parallel (as TestReadRate and TestCallerLifetime): most of its time is the slow readers' pace and
// bounded waits, and it shares nothing with other tests; TestMain checks for leaks after all.
func TestSlowReadersDoNotStarveOtherCallers(t *testing.T) {
	t.Parallel()
	const perSource, total, readers = 8, 16, 20
	up := newTestUpstream(t, testUsers)
	up.sendBuffer.Store(slowBlobSendBuffer)
	e := startRelay(t, up.URL(), "", func(o *registry.Options) {
		o.MaxFetchesPerSource, o.MaxFetches = perSource, total
		o.MaxAuthorizationsPerSource, o.MaxAuthorizations = 2, 4
		o.MaxUpstreamConns = total + 4 // exactly the slots: none of them waits on the transport
		o.SlotWait = 300 * time.Millisecond
		o.ReadRateWindow = time.Hour // nobody is cut for reading slowly here (TestReadRate)
	})
	big := pushBlob(t, up, "team/app", 4<<20) // far beyond every socket buffer on the way (slowBlobSendBuffer)
	hitPath, hitDigest, _, tok := cachedLayer(t, up, e, 64<<10)
	honest := pushImage(t, up, "team/app", 64<<10, 2) // pulled through the relay later, uncached
	bobTok := up.tokenFor(t, "bob", "bob-secret-pw")

	// 20 slow readers from 127.0.0.1, each a GET with a query: never cached, always forwarded.
	slowA := make([]*slowReader, readers)
	for i := range slowA {
		slowA[i] = startSlowReader(t, e, "127.0.0.1", fmt.Sprintf("/v2/team/app/blobs/%s?n=%d", big, i), tok)
	}
	e.Eventually("every slow reader holds an upstream request or was refused", func() bool {
		return up.inflight.Load()+int64(refusedCount(slowA)) == readers
	})

	// Meanwhile bob, from 127.0.0.2, pulls an image nobody has cached and reads a stored layer
	// (a hit: an authorization HEAD, then the file). Neither may wait on the slow readers.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	pulled, hit := make(chan error, 1), make(chan error, 1)
	go func() {
		pulled <- pullImage(t, e, newClientFrom(t, "127.0.0.2", "bob", "bob-secret-pw", remote.WithContext(ctx)), "team/app", honest)
	}()
	heads := up.heads.Load()
	go func() {
		status, digest, _, err := getFrom(ctx, e, "127.0.0.2", hitPath, bobTok)
		if err == nil && (status != http.StatusOK || digest != hitDigest) {
			err = fmt.Errorf("status %d, digest %s", status, digest)
		}
		hit <- err
	}()
	if err := <-pulled; err != nil {
		t.Errorf("an honest pull from another address, while one address's slow readers held the upstream: %v", err)
	}
	if err := <-hit; err != nil {
		t.Errorf("a cache hit from another address, while one address's slow readers held the upstream: %v", err)
	}
	if t.Failed() {
		t.FailNow()
	}
	if got := up.heads.Load() - heads; got < 1 {
		t.Fatalf("the hit was served without an authorization HEAD (%d)", got)
	}

	// The slow address had its 8 fetches; the rest waited SlotWait and were refused, 503 with
	// Retry-After and a named reason.
	e.Eventually("every slow reader answered", func() bool {
		for _, s := range slowA {
			if _, ok := s.answered(); !ok {
				return false
			}
		}
		return true
	})
	served := 0
	for _, s := range slowA {
		switch {
		case s.status == http.StatusOK:
			served++
		case s.status != http.StatusServiceUnavailable || !strings.Contains(s.body, "registry-upstream-busy"):
			t.Errorf("a slow reader beyond its address's slots: %d %q", s.status, s.body)
		default:
			if n, err := strconv.Atoi(s.retryAfter); err != nil || n < 1 {
				t.Errorf("a refused wait's Retry-After is %q", s.retryAfter)
			}
		}
	}
	if served != perSource {
		t.Fatalf("%d slow readers from one address were served, want %d", served, perSource)
	}
	e.settle()
	e.Eventually("only the slow readers hold fetch slots", func() bool {
		return e.Metric("relay_registry_slots_in_use", "pool", "fetch") == perSource && up.inflight.Load() == perSource
	})
	if got := e.Metric("relay_registry_slot_waits_refused_total", "pool", "fetch", "limit", "source"); got != readers-perSource {
		t.Fatalf("refused fetch waits at the source limit = %v, want %d", got, readers-perSource)
	}

	// A second slow address takes the remaining fetch slots: every one is held. A miss now waits
	// its bounded wait and is refused, but a hit still gets its authorization at once.
	slowC := make([]*slowReader, perSource)
	for i := range slowC {
		slowC[i] = startSlowReader(t, e, "127.0.0.3", fmt.Sprintf("/v2/team/app/blobs/%s?c=%d", big, i), tok)
	}
	e.Eventually("every fetch slot is held by a slow reader", func() bool {
		return e.Metric("relay_registry_slots_in_use", "pool", "fetch") == total && up.inflight.Load() == total
	})
	heads = up.heads.Load()
	status, digest, _, err := getFrom(ctx, e, "127.0.0.2", hitPath, bobTok)
	if err != nil || status != http.StatusOK || digest != hitDigest || up.heads.Load() != heads+1 {
		t.Fatalf("a cache hit while every fetch slot is held: %d %v, HEADs +%d", status, err, up.heads.Load()-heads)
	}
	status, _, hdr, err := getFrom(ctx, e, "127.0.0.2", "/v2/team/app/blobs/"+big+"?miss", bobTok)
	if err != nil || status != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("a miss while every fetch slot is held: %d %v, Retry-After %q", status, err, hdr.Get("Retry-After"))
	}
	if got := e.Metric("relay_registry_slot_waits_refused_total", "pool", "fetch", "limit", "total"); got != 1 {
		t.Fatalf("refused fetch waits at the total limit = %v, want 1", got)
	}
	if got := e.Metric("relay_registry_slot_waits_refused_total", "pool", "authorize", "limit", "total") +
		e.Metric("relay_registry_slot_waits_refused_total", "pool", "authorize", "limit", "source"); got != 0 {
		t.Fatalf("%v authorization waits refused", got)
	}

	for _, s := range append(slowA, slowC...) {
		s.close()
	}
	e.Eventually("every slot is released once the slow readers leave", func() bool {
		return e.Metric("relay_registry_slots_in_use", "pool", "fetch") == 0 &&
			e.Metric("relay_registry_slots_in_use", "pool", "authorize") == 0 && up.inflight.Load() == 0
	})
}

// TestReadRate: a caller is judged by how fast it takes what the relay has for it, never by how
// fast the upstream sends. Its cases wait out rate windows and a slow upstream, each with its own
// upstream and relay: they run in parallel.
func TestReadRate(t *testing.T) {
	t.Parallel()
	t.Run("a caller reading slower than the minimum rate is cut and its slot released", func(t *testing.T) {
		t.Parallel()
		up := newTestUpstream(t, testUsers)
		up.sendBuffer.Store(slowBlobSendBuffer) // the upstream is still sending when the reader is cut
		// A 1 s window at 1 MiB/s stands in for 30 s at 64 KiB/s: a window's due (1 MiB) is
		// beyond what one write moves (256 KiB), as 1.875 MiB is, so the cut comes as it ends.
		e := startRelay(t, up.URL(), "", func(o *registry.Options) { o.MinReadRate, o.ReadRateWindow = 1<<20, time.Second })
		const size = 4 << 20
		big := pushBlob(t, up, "team/app", size)
		tok := up.tokenFor(t, "alice", "alice-secret-pw")
		s := startSlowReader(t, e, "127.0.0.1", "/v2/team/app/blobs/"+big+"?slow", tok)
		e.Eventually("the slow reader is cut", func() bool { return e.Metric("relay_registry_slow_readers_cut_total") == 1 })
		e.Eventually("the cut caller's slot and upstream request are released", func() bool {
			return e.Metric("relay_registry_slots_in_use", "pool", "fetch") == 0 && up.inflight.Load() == 0
		})
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
		// Had the upstream sent it all, its request would have ended without the relay.
		if got := up.blobBytes.Load(); got >= size {
			t.Fatalf("the upstream sent all %d bytes: its request did not end with the cut caller's (or the blob fit in the socket buffers)", got)
		}
	})
	// A hit goes to its caller by sendfile (callerWriter.ReadFrom); the rule is the same.
	t.Run("a slow reader of a stored object is cut", func(t *testing.T) {
		t.Parallel()
		up := newTestUpstream(t, testUsers)
		e := startRelay(t, up.URL(), "", func(o *registry.Options) { o.MinReadRate, o.ReadRateWindow = 1<<20, time.Second })
		const size = 2 << 20 // the relay's send buffer to a reader with a 1400-byte MSS holds tens of KiB
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
		t.Parallel()
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
