package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"time"
)

// A fill fetches one digest from the upstream into a temporary file, once, however many callers
// want it. Its goroutine (runFill) owns the upstream answer and the file's writes; every caller,
// the one whose GET it sends (the leader) included, reads the file as it grows (tail), so a slow
// caller never slows the fill or another caller. A caller never receives the object's last byte
// before the whole object hashed to its digest: when it does not, the callers' answers are cut
// short of their Content-Length, and a client sees a broken transfer, never a complete wrong one.
//
// States: waiting → abandoned (the upstream's answer is not cacheable: it goes to the leader as
// it is, and callers who joined fetch for themselves) or waiting → streaming → verified (then
// published) | failed.
type fill struct {
	hex string // set at construction
	c   *cache // set at construction

	mu          sync.Mutex
	state       fillState      // guarded by mu
	size        int64          // guarded by mu: set when streaming starts
	written     int64          // guarded by mu: bytes in the file
	notified    int64          // guarded by mu: written when callers were last woken
	notifyArmed bool           // guarded by mu: a wake-up for bytes short of a batch is due
	path        string         // guarded by mu: the temporary file, then the published one
	header      http.Header    // guarded by mu: the upstream's answer headers, for the leader
	resp        *http.Response // guarded by mu: abandoned: the upstream's answer, the leader's to write
	stop        func()         // guarded by mu: abandoned: ends resp's context once the leader is done
	err         error          // guarded by mu: abandoned without an answer, or failed: why
	changed     chan struct{}  // guarded by mu: closed and replaced at every change
}

type fillState uint8

const (
	fillWaiting fillState = iota
	fillAbandoned
	fillStreaming
	fillVerified
	fillFailed
)

func newFill(c *cache, hex string) *fill { return &fill{c: c, hex: hex, changed: make(chan struct{})} }

// updateLocked wakes every caller waiting on the fill.
func (f *fill) updateLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fill) abandon(resp *http.Response, stop func(), err error) {
	f.mu.Lock()
	f.state, f.resp, f.stop, f.err = fillAbandoned, resp, stop, err
	f.updateLocked()
	f.mu.Unlock()
}

func (f *fill) start(size int64, path string, header http.Header) {
	f.mu.Lock()
	f.state, f.size, f.path, f.header = fillStreaming, size, path, header
	f.updateLocked()
	f.mu.Unlock()
}

// notifyEvery batches progress: callers tailing a fill wake once per this many new bytes (and at
// the end), not once per read from the upstream, so ten tailers cost ten wake-ups and ten
// sendfile calls per 256 KiB rather than per socket read. Bytes short of a batch wait at most
// notifyAfter: an upstream that sends slowly, or stops halfway, must not hold back from callers
// what already arrived.
const (
	notifyEvery = 256 << 10
	notifyAfter = 5 * time.Millisecond
)

func (f *fill) progress(written int64) {
	f.mu.Lock()
	f.written = written
	switch {
	case written-f.notified >= notifyEvery:
		f.notifyLocked()
	case !f.notifyArmed:
		f.notifyArmed = true
		time.AfterFunc(notifyAfter, func() {
			f.mu.Lock()
			f.notifyArmed = false
			if f.written > f.notified {
				f.notifyLocked()
			}
			f.mu.Unlock()
		})
	}
	f.mu.Unlock()
}

// notifyLocked wakes the callers tailing the fill with every byte written so far.
func (f *fill) notifyLocked() {
	f.notified = f.written
	f.updateLocked()
}

func (f *fill) finish(err error) {
	f.mu.Lock()
	if err != nil {
		f.state, f.err = fillFailed, err
	} else {
		f.state = fillVerified
	}
	f.updateLocked()
	f.mu.Unlock()
}

// rename moves the file while no caller can be opening it.
func (f *fill) rename(to string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := os.Rename(f.path, to); err != nil {
		return err
	}
	f.path = to
	return nil
}

// wait blocks until the fill has left the waiting state, or ctx ends (nil ctx: no end), and
// reports the state then.
func (f *fill) wait(ctx context.Context) fillState {
	for {
		f.mu.Lock()
		st, ch := f.state, f.changed
		f.mu.Unlock()
		if st != fillWaiting {
			return st
		}
		if ctx == nil {
			<-ch
			continue
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fillWaiting
		}
	}
}

// open opens the fill's file for a caller, or fails when the fill did.
func (f *fill) open() (*os.File, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == fillFailed || f.state == fillAbandoned {
		if f.err == nil {
			return nil, 0, errFillFailed
		}
		return nil, 0, f.err
	}
	file, err := os.Open(f.path)
	return file, f.size, err
}

// errFillFailed ends a caller's answer that already carries bytes of a fill that failed.
var errFillFailed = errors.New("fill failed")

// tail copies the file to w as it grows, holding the last byte back until the fill is verified.
// A non-nil *head writes the answer's head: tail calls it, and sets it to nil, just before the
// first byte, so that a fill failing before then can still be refused with a status. (For an
// empty object the caller waits for the verdict before its head: see serveFill.)
func (f *fill) tail(ctx context.Context, w io.Writer, file *os.File, head *func()) error {
	var sent int64
	for {
		f.mu.Lock()
		st, size, written, ch := f.state, f.size, f.written, f.changed
		f.mu.Unlock()
		if st == fillFailed {
			return errFillFailed
		}
		limit := written
		if st != fillVerified && limit == size {
			limit = size - 1
		}
		if sent < limit {
			if *head != nil {
				(*head)()
				*head = nil
			}
			n, err := io.Copy(w, io.LimitReader(file, limit-sent))
			sent += n
			if err != nil {
				return err
			}
			continue
		}
		if st == fillVerified && sent == size {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// runFill sends the leader's GET to the upstream and, when the answer is a cacheable 200, writes
// it to a temporary file, verifies it and publishes it. It runs on its own goroutine under the
// registry's context, so it outlives a leader who leaves and ends when the registry closes. It
// releases the leader's fetch slot sl with the upstream's answer, or hands both to the leader.
func (r *Registry) runFill(f *fill, out *http.Request, cancel context.CancelCauseFunc, sl *slot) {
	defer r.fillsWG.Done()
	defer f.c.done(f)
	handedOver := false
	defer func() {
		if !handedOver {
			cancel(nil)
			sl.release()
		}
	}()

	// A fill leaves the table before callers hear it was abandoned or failed, so that a caller
	// starting over finds the next fill, not this one.
	resp, err := r.follow.Do(out)
	if err != nil {
		reason := "upstream"
		if context.Cause(out.Context()) == errClosed {
			reason = "closed" // Close came before the upstream's head
		}
		r.m.fillFailures.WithLabelValues(reason).Inc()
		f.c.done(f)
		f.abandon(nil, nil, err)
		return
	}
	bypass := func(reason string) {
		r.m.bypassed(reason)
		handedOver = true
		f.c.done(f)
		f.abandon(resp, func() { cancel(nil); resp.Body.Close(); sl.release() }, nil) // cancel first: it ends a read in progress
	}
	size := resp.ContentLength
	if !cacheableAnswer(resp, f.hex) {
		bypass(bypassNotCacheable)
		return
	}
	if !f.c.reserve(size) {
		bypass(bypassTooLarge)
		return
	}
	tmp, err := f.c.createTemp()
	if err == nil {
		if err = preallocate(tmp, size); err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}
	if err != nil {
		f.c.release(size)
		f.c.suspend(err)
		bypass(bypassDisk)
		return
	}
	defer resp.Body.Close()
	f.start(size, tmp.Name(), resp.Header.Clone())

	if err := r.copyFill(out.Context(), cancel, f, resp.Body, tmp, size); err != nil {
		tmp.Close()
		f.c.release(size)
		r.m.fillFailures.WithLabelValues(fillFailureReason(err)).Inc()
		r.log.Warn().Str("digest", "sha256:"+f.hex).Int64("bytes", size).Str("outcome", fillFailureReason(err)).
			Msg("fill not published")
		f.c.done(f)
		f.finish(err)
		os.Remove(tmp.Name()) // after finish: nobody opens it now; callers reading it keep their files
		return
	}
	// Verified: callers may have their last byte now. Syncing and publishing (fsync, rename)
	// change nothing they read, so they do not wait for the disk.
	f.finish(nil)
	serr := tmp.Sync()
	if cerr := tmp.Close(); serr == nil {
		serr = cerr
	}
	if serr == nil {
		serr = f.c.publish(f, size)
	}
	if serr != nil {
		f.c.done(f) // a caller arriving now starts a new fill rather than open a removed file
		os.Remove(tmp.Name())
		f.c.release(size)
		f.c.suspend(serr)
		r.m.fillFailures.WithLabelValues("disk").Inc()
		return
	}
	r.log.Debug().Str("digest", "sha256:"+f.hex).Int64("bytes", size).Str("outcome", "published").Msg("fill")
}

// copyFill streams the body into the file, hashing it, and reports the verdict: nil only when
// exactly size bytes arrived and they hash to the digest. A stall cancels the fill.
func (r *Registry) copyFill(ctx context.Context, cancel context.CancelCauseFunc, f *fill, body io.Reader, tmp *os.File, size int64) error {
	stall := time.AfterFunc(r.stallTimeout, func() { cancel(errStalled) })
	defer stall.Stop()
	h := sha256.New()
	bufp := getBuffer()
	defer putBuffer(bufp)
	buf := *bufp
	var got int64
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			stall.Reset(r.stallTimeout)
			if got+int64(n) > size {
				return errSizeMismatch
			}
			h.Write(buf[:n])
			if _, err := tmp.Write(buf[:n]); err != nil {
				f.c.suspend(err)
				return errDisk
			}
			got += int64(n)
			f.progress(got)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if cause := context.Cause(ctx); cause == errStalled || cause == errClosed {
				return cause
			}
			return rerr
		}
	}
	if got != size {
		return errSizeMismatch
	}
	var sum [sha256.Size]byte
	if hex.EncodeToString(h.Sum(sum[:0])) != f.hex {
		return errDigestMismatch
	}
	return nil
}

// cacheableAnswer: a plain 200 with a known length, unencoded, and no Docker-Content-Digest that
// names another digest.
func cacheableAnswer(resp *http.Response, hex string) bool {
	if resp.StatusCode != http.StatusOK || resp.ContentLength < 0 {
		return false
	}
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && ce != "identity" {
		return false
	}
	if dcd := resp.Header.Get("Docker-Content-Digest"); dcd != "" && dcd != "sha256:"+hex {
		return false
	}
	return true
}

// bufferSize is the copy buffer of fills and forwarded bodies.
const bufferSize = 256 << 10

var buffers = sync.Pool{New: func() any { b := make([]byte, bufferSize); return &b }}

func getBuffer() *[]byte  { return buffers.Get().(*[]byte) }
func putBuffer(b *[]byte) { buffers.Put(b) }
