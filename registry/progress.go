package registry

import (
	"io"
	"net/http"
	"time"
)

// Progress deadlines (SPEC §15). A caller that stops reading its answer, or stops sending its
// upload, would otherwise hold its handler for ever, and with it a stored object (evicted or not:
// the file stays open), a fill's file or an upstream connection. So every write to a caller, and
// every read of its request body, must complete within the progress timeout: the deadline is set
// just before and cleared just after, so it bounds the caller alone, never the relay's own waits
// for the upstream or a fill (an HTTP/2 stream whose deadline passes is reset even while idle).
// A write moves at most one copy buffer (256 KiB), so a caller slower than about 256 KiB per
// progress timeout is cut off. The answer's last buffered bytes are flushed under the same
// deadline before the handler returns; then the connection is left without a deadline, for
// whatever it serves next.

// callerWriter is the caller's ResponseWriter as the registry writes to it: it bounds each write
// by the progress timeout, counts body bytes and keeps the status for the log. It passes ReadFrom
// on in chunks of one copy buffer, each a single *io.LimitedReader around the source, so that a
// file copied to a plain-TCP caller still goes by sendfile.
type callerWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController // set at construction
	timeout time.Duration            // set at construction
	n       int64
	status  int
}

func newCallerWriter(w http.ResponseWriter, timeout time.Duration) *callerWriter {
	return &callerWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: timeout}
}

func (c *callerWriter) arm()    { c.rc.SetWriteDeadline(time.Now().Add(c.timeout)) }
func (c *callerWriter) disarm() { c.rc.SetWriteDeadline(time.Time{}) }

func (c *callerWriter) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *callerWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.arm()
	n, err := c.ResponseWriter.Write(p)
	c.disarm()
	c.n += int64(n)
	return n, err
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
		c.arm()
		n, err := rf.ReadFrom(&io.LimitedReader{R: inner, N: chunk})
		c.disarm()
		total, left = total+n, left-n
		c.n += n
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
// connection without a deadline. A handler that wrote nothing leaves the answer to the server.
func (c *callerWriter) finish() {
	if c.status == 0 {
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
