package vstream

import (
	"errors"
	"io"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"code.foss.global/serve.zone/relay/contracts"
)

// ReaderOptions shape a Reader; zero values mean the defaults.
type ReaderOptions struct {
	Clock clock.WithTicker // nil: the wall clock
	Idle  time.Duration    // no chunk this long while Read waits: relay-closure-stalled
	Queue int              // chunks held before Read took them; a writer past it is refused relay-node-busy
	Limit int64            // more bytes than this fail relay-request-invalid; 0: no limit
	// Budget is charged each queued chunk's frame until Read took it; nil charges nothing.
	Budget Budget
	// Stop, when closed, ends Read with Stopped (ErrStopped when nil); the writer hears it too.
	Stop    <-chan struct{}
	Stopped error
	// Taken hears the bytes of each chunk Read handed over.
	Taken func(n int)
	// Dropped hears a frame that was not readable.
	Dropped func(reason string)
	// Peer names the other end in refusal reasons ("the peer" when empty).
	Peer string
}

// Reader is the reading end of one stream, and an io.Reader of its bytes. Its StreamFrame takes
// the writer's frames on the link's read loop: keep-alives and feedback requests are answered
// there, chunks queued for Read, charged to the budget until Read took them. Each chunk is
// answered once Read has handed it over, so a writer that waits for its answers, as the library
// does, has one chunk in flight; one that does not is held to Queue chunks and the budget, then
// refused relay-node-busy.
type Reader struct {
	opts   ReaderOptions
	clock  clock.WithTicker
	chunks chan queuedChunk // filled on the read loop, emptied by Read
	failed chan struct{}    // closed by Fail

	mu      sync.Mutex
	link    Link  // guarded by mu: set before any frame arrives (Attach)
	failure error // guarded by mu: why the stream was refused or ended early
	aborted bool  // guarded by mu: the writer ended the stream with keepAlive false
	closed  bool  // guarded by mu: Close was called; nothing more is queued

	// Owned by Read.
	buf   []byte
	left  []byte
	total int64
	done  bool
}

// queuedChunk is one chunk frame read on the read loop, waiting for Read.
type queuedChunk struct {
	f    contracts.StreamFrameBody
	size int // the frame's bytes, charged to the budget
}

// NewReader returns a reader; Attach gives it its link.
func NewReader(opts ReaderOptions) *Reader {
	if opts.Idle <= 0 {
		opts.Idle = DefaultIdle
	}
	if opts.Queue <= 0 {
		opts.Queue = DefaultQueue
	}
	if opts.Peer == "" {
		opts.Peer = "the peer"
	}
	if opts.Stopped == nil {
		opts.Stopped = ErrStopped
	}
	return &Reader{opts: opts, clock: orReal(opts.Clock), chunks: make(chan queuedChunk, opts.Queue), failed: make(chan struct{})}
}

// Attach sets the link answers go out on; call it before the link's first frame is read.
func (r *Reader) Attach(l Link) {
	r.mu.Lock()
	r.link = l
	r.mu.Unlock()
}

func (r *Reader) getLink() Link {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.link
}

// Err is why the stream ended early; nil while it has not.
func (r *Reader) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failure
}

// Aborted reports whether the writer ended the stream without its closing chunk.
func (r *Reader) Aborted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.aborted
}

// Total is the bytes Read has handed over.
func (r *Reader) Total() int64 { return r.total }

// Fail ends the stream early with err, once: chunks waiting, and every chunk the writer sends
// after, are answered with it.
func (r *Reader) Fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failure == nil {
		r.failure = err
		close(r.failed)
	}
}

// StreamFrame takes one of the writer's frames. It never blocks.
func (r *Reader) StreamFrame(frame []byte) {
	f, err := contracts.ReadStreamFrameBody(frame)
	switch {
	case err != nil:
		if r.opts.Dropped != nil {
			r.opts.Dropped("unreadable")
		}
		return
	case f.Response.Present || !f.Request.Present:
		// An answer (a reader sends no requests): never answered back, or the two ends would
		// bounce it for ever.
		return
	}
	l := r.getLink()
	if l == nil {
		return
	}
	answer := answerFor(l.ID(), f)
	if refusal := r.Err(); refusal != nil {
		answer.Request, answer.Purpose, answer.KeepAlive, answer.Refusal = nil, "feedback", false, AsRefusal(refusal)
		l.Send(contracts.AppendStreamAnswer(nil, answer))
		return
	}
	switch f.Request.MainPurpose {
	case "chunk":
		if err := r.queue(f, len(frame)); err != nil {
			r.refuse(l, answer, err)
		}
	case "keepAlive":
		if !answer.KeepAlive {
			r.mu.Lock()
			r.aborted = true
			r.mu.Unlock()
			r.Fail(contracts.RelayUpstreamDetached.Refuse("%s ended the stream before its closing chunk", r.opts.Peer))
		}
		l.Send(contracts.AppendStreamAnswer(nil, answer))
	default:
		answer.Backpressure = len(r.chunks) >= r.opts.Queue
		l.Send(contracts.AppendStreamAnswer(nil, answer))
	}
}

// Answer is the answer a reader with room gives a writer's request frame (a chunk, a keep-alive,
// a feedback request), as the library's reader builds it: same streamId and cycleId, a keep-alive
// answered keepAlive (false when the writer ended the stream), anything else feedback without
// backpressure, a chunk's answer with request null. ok is false for a frame that is no request
// (an answer is never answered back) or not readable. A Reader answers its own stream's frames;
// Answer is for an end that chooses to answer a frame of a stream it keeps no Reader for as an
// open stream would (the simulator's stand-ins): the library itself hands such a frame back
// unchanged.
func Answer(frame []byte) (answer []byte, ok bool) {
	f, err := contracts.ReadStreamFrameBody(frame)
	if err != nil || f.Response.Present || !f.Request.Present {
		return nil, false
	}
	a := answerFor(f.Request.StreamID, f)
	if f.Request.MainPurpose == "chunk" {
		a.Request = nil
	}
	return contracts.AppendStreamAnswer(nil, a), true
}

// answerFor is the answer to request frame f on stream id, before the reader's state is read:
// the request echoed, feedback, or keepAlive for a keep-alive (false when f ends the stream).
func answerFor(id string, f contracts.StreamFrameBody) contracts.StreamAnswer {
	a := contracts.StreamAnswer{StreamID: id, CycleID: f.Request.CycleID, Purpose: "feedback", Request: f.RequestRaw}
	if f.Request.MainPurpose == "keepAlive" {
		a.Purpose, a.KeepAlive = "keepAlive", !(f.Request.HasKeepAlive && !f.Request.KeepAlive)
	}
	return a
}

// queue holds a chunk for Read, charged to the budget, unless the reader is closed.
func (r *Reader) queue(f contracts.StreamFrameBody, size int) *contracts.Refusal {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return nil
	case r.opts.Budget != nil && !r.opts.Budget.Charge(size):
		return contracts.RelayNodeBusy.Refuse("the stream's share of memory is spent: wait for each chunk's answer")
	}
	select {
	case r.chunks <- queuedChunk{f: f, size: size}:
		return nil
	default:
		r.release(size)
		return contracts.RelayNodeBusy.Refuse("%d chunks of the stream wait already: wait for each chunk's answer", r.opts.Queue)
	}
}

func (r *Reader) release(n int) {
	if r.opts.Budget != nil {
		r.opts.Budget.Release(n)
	}
}

func (r *Reader) refuse(l Link, a contracts.StreamAnswer, err *contracts.Refusal) {
	r.Fail(err)
	a.Request, a.Refusal = nil, err
	l.Send(contracts.AppendStreamAnswer(nil, a))
}

// AsRefusal is err as the refusal an answer carries: err's own, or relay-request-invalid.
func AsRefusal(err error) *contracts.Refusal {
	var ref *contracts.Refusal
	if errors.As(err, &ref) {
		return ref
	}
	return contracts.RelayRequestInvalid.Refuse("the stream was ended")
}

// Read hands over the stream's bytes, chunk by chunk, each chunk answered once handed over. It
// ends at the closing chunk (io.EOF), and fails when the stream ends early, stands still for
// Idle, or passes the limit.
func (r *Reader) Read(b []byte) (int, error) {
	for len(r.left) == 0 {
		if r.done {
			return 0, io.EOF
		}
		if err := r.next(); err != nil {
			return 0, err
		}
	}
	n := copy(b, r.left)
	r.left = r.left[n:]
	return n, nil
}

// next takes the next chunk, answers it, and leaves its bytes in left.
func (r *Reader) next() error {
	idle := r.clock.NewTimer(r.opts.Idle)
	defer idle.Stop()
	l := r.getLink()
	var done <-chan struct{}
	if l != nil {
		done = l.Done()
	}
	var q queuedChunk
	select {
	case q = <-r.chunks:
	case <-r.failed:
		return r.Err()
	case <-idle.C():
		err := contracts.RelayClosureStalled.Refuse("%s sent no chunk of the stream for %s", r.opts.Peer, r.opts.Idle)
		r.Fail(err)
		return err
	case <-done:
		err := contracts.RelayUpstreamDetached.Refuse("the link to %s was lost during the stream", r.opts.Peer)
		r.Fail(err)
		return err
	case <-r.opts.Stop:
		r.Fail(r.opts.Stopped)
		return r.opts.Stopped
	}
	data, closing, err := contracts.AppendChunkData(r.buf[:0], q.f.Request.ChunkData)
	r.release(q.size)
	answer := contracts.StreamAnswer{StreamID: l.ID(), CycleID: q.f.Request.CycleID, Purpose: "feedback"}
	switch {
	case err != nil:
		ref := contracts.RelayRequestInvalid.Refuse("a stream chunk in no encoding the library writes")
		r.refuse(l, answer, ref)
		return ref
	case r.opts.Limit > 0 && r.total+int64(len(data)) > r.opts.Limit:
		ref := contracts.RelayRequestInvalid.Refuse("the stream is over its limit of %d bytes", r.opts.Limit)
		r.refuse(l, answer, ref)
		return ref
	}
	r.buf = data
	r.total += int64(len(data))
	r.left, r.done = data, closing
	if len(data) > 0 && r.opts.Taken != nil {
		r.opts.Taken(len(data))
	}
	// The chunk is the consumer's once Read returns it: the writer may send the next.
	l.Send(contracts.AppendStreamAnswer(nil, answer))
	return nil
}

// Close ends the reader: chunks still queued are released and answered with why the stream
// ended, so that a writer waiting for one hears it; none is queued after.
func (r *Reader) Close() {
	r.mu.Lock()
	r.closed = true
	var left []queuedChunk
	for len(r.chunks) > 0 {
		left = append(left, <-r.chunks)
	}
	failure, l := r.failure, r.link
	r.mu.Unlock()
	for _, q := range left {
		r.release(q.size)
		if l != nil {
			l.Send(contracts.AppendStreamAnswer(nil, contracts.StreamAnswer{StreamID: l.ID(), CycleID: q.f.Request.CycleID,
				Purpose: "feedback", Refusal: AsRefusal(failure)}))
		}
	}
}
