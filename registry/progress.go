package registry

import (
	"errors"
	"io"
	"net/http"
	"os"
	"time"
)

// Progress deadlines (docs/hostile.md). A caller that stops reading its answer, or stops sending its
// upload, would otherwise hold its handler for ever, and with it a stored object (evicted or not:
// the file stays open), a fill's file or an upstream connection. So every write to a caller, and
// every read of its request body, must complete within the progress timeout: the deadline is set
// just before and cleared just after, so it bounds the caller alone, never the relay's own waits
// for the upstream or a fill (an HTTP/2 stream whose deadline passes is reset even while idle).
// A write moves at most one copy buffer (256 KiB), so a caller slower than about 256 KiB per
// progress timeout is cut off. The answer's last buffered bytes are flushed under the same
// deadline before the handler returns; then the connection is left without a deadline, for
// whatever it serves next.

// Minimum read rate (docs/hostile.md, "/v2/ fairness"). The progress timeout cuts a caller that stops;
// one that reads a few KiB a second would still hold a forward's upstream connection and its
// fetch slot for as long as it liked. So a caller must also take its answer at readRate.min
// bytes per second, judged over windows of readRate.window of the time the relay spends writing
// to it: only the time a write to the caller takes counts, never the relay's own waits for the
// upstream or a fill, so a caller is never cut for the upstream's pace. A caller that falls
// short is cut (cutSlow): its answer breaks off, its connection closes, its slot goes back. A
// write that could not bring the window up to the rate even if it moved all its bytes gets the
// window's end as its deadline, so the cut comes when the window ends, not when the write does.

// readRate is the rule a caller's reading is held to; a zero min checks nothing.
type readRate struct {
	min    int64         // bytes per second
	window time.Duration // of time spent writing to the caller
	cut    func()        // counts a caller cut
}

// need is what a caller must take in a whole window.
func (r readRate) need() int64 { return int64(float64(r.min) * r.window.Seconds()) }

// callerWriter is the caller's ResponseWriter as the registry writes to it: it bounds each write
// by the progress timeout and the read rate, counts body bytes and keeps the status for the log.
// It passes ReadFrom on in chunks of one copy buffer, each a single *io.LimitedReader around the
// source, so that a file copied to a plain-TCP caller still goes by sendfile. It is used by the
// request's handler goroutine alone.
type callerWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController // set at construction
	timeout time.Duration            // set at construction
	rate    readRate                 // set at construction
	n       int64                    // owned by the handler: body bytes written
	status  int                      // owned by the handler
	spent   time.Duration            // owned by the handler: time spent writing in this rate window
	taken   int64                    // owned by the handler: bytes written in this rate window
	cut     bool                     // owned by the handler: cut for reading slowly; writes fail
}

func newCallerWriter(w http.ResponseWriter, timeout time.Duration, rate readRate) *callerWriter {
	return &callerWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: timeout, rate: rate}
}

func (c *callerWriter) arm()    { c.rc.SetWriteDeadline(time.Now().Add(c.timeout)) }
func (c *callerWriter) disarm() { c.rc.SetWriteDeadline(time.Time{}) }

func (c *callerWriter) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

// write runs one write of at most n bytes under its deadline (the progress timeout, or the rate
// window's end: see above), books its time and bytes to the window, and cuts a caller that fell
// short.
func (c *callerWriter) write(n int64, do func() (int64, error)) (int64, error) {
	if c.cut {
		return 0, errSlowReader
	}
	start := time.Now()
	deadline, windowEnd := start.Add(c.timeout), false
	if c.rate.min > 0 {
		if left := c.rate.window - c.spent; left < c.timeout && c.taken+n < c.rate.need() {
			deadline, windowEnd = start.Add(left), true
		}
	}
	c.rc.SetWriteDeadline(deadline)
	written, err := do()
	c.spent += time.Since(start)
	c.taken += written
	c.n += written
	if c.rate.min > 0 {
		switch {
		case windowEnd && errors.Is(err, os.ErrDeadlineExceeded):
			return written, c.cutSlow()
		case err == nil && c.spent >= c.rate.window:
			if float64(c.taken) < float64(c.rate.min)*c.spent.Seconds() {
				return written, c.cutSlow()
			}
			c.spent, c.taken = 0, 0
		}
	}
	c.disarm()
	return written, err
}

// cutSlow cuts a caller for reading slowly. A deadline in the past fails every later write, the
// server's final flush included, so that nothing more is queued for the caller and closing its
// connection never waits on it; ServeHTTP then aborts the answer, and the server closes the
// connection. (A write that failed at the window's end has had the server close it already.)
func (c *callerWriter) cutSlow() error {
	c.cut = true
	c.rc.SetWriteDeadline(time.Unix(1, 0))
	if c.rate.cut != nil {
		c.rate.cut()
	}
	return errSlowReader
}

func (c *callerWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	n, err := c.write(int64(len(p)), func() (int64, error) {
		n, err := c.ResponseWriter.Write(p)
		return int64(n), err
	})
	return int(n), err
}

func (c *callerWriter) ReadFrom(src io.Reader) (int64, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	rf, ok := c.ResponseWriter.(io.ReaderFrom)
	if !ok {
		return io.Copy(struct{ io.Writer }{c}, src)
	}
	outer, limited := src.(*io.LimitedReader)
	inner, left := src, int64(1<<63-1)
	if limited {
		inner, left = outer.R, outer.N
	}
	var total int64
	for left > 0 {
		chunk := min(left, bufferSize)
		n, err := c.write(chunk, func() (int64, error) { return rf.ReadFrom(&io.LimitedReader{R: inner, N: chunk}) })
		total, left = total+n, left-n
		if limited {
			outer.N -= n
		}
		if err != nil || n < chunk {
			return total, err
		}
	}
	return total, nil
}

// finish flushes what the answer still buffers within the progress timeout and leaves the
// connection without a deadline. A handler that wrote nothing leaves the answer to the server; a
// caller cut for reading slowly gets nothing more.
func (c *callerWriter) finish() {
	if c.status == 0 || c.cut {
		return
	}
	c.arm()
	c.rc.Flush()
	c.disarm()
}

func (c *callerWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// callerBody is a request body whose every read must complete within the progress timeout.
type callerBody struct {
	io.ReadCloser
	rc      *http.ResponseController // set at construction
	timeout time.Duration            // set at construction
}

func (b *callerBody) Read(p []byte) (int, error) {
	b.rc.SetReadDeadline(time.Now().Add(b.timeout))
	n, err := b.ReadCloser.Read(p)
	b.rc.SetReadDeadline(time.Time{})
	return n, err
}
