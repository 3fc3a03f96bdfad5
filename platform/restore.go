package platform

import (
	"encoding/json"
	"errors"
	"io"
	"sync"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// Restores, Cloudly → node: restoreServiceDatabaseClosure answers with the closure as a
// VirtualStream Cloudly writes; the relay accepts the stream in the call's answer (on the socket's
// read loop, before Cloudly's first chunk is read) and streams what arrives into the node's
// Corestore. Each chunk is answered once it has been handed to Corestore, so a writer that waits
// for its answers, as the library does, has one chunk in flight; a writer that does not is held
// to maxQueuedChunks and the closure's share, then refused relay-node-busy.

// maxQueuedChunks bounds the chunks a restore holds before Corestore took them.
const maxQueuedChunks = 4

// restore asks Cloudly for one wanted restore's closure and writes it into the node's Corestore.
func (n *node) restore(origin string, cred contracts.Secret, r contracts.CorestoreRestore) {
	start := time.Now()
	got, err := n.receiveRestore(origin, cred, r)
	n.carried(carriedRestore, r.BackupID, got, err, start)
}

func (n *node) receiveRestore(origin string, cred contracts.Secret, r contracts.CorestoreRestore) (int64, error) {
	p := n.p
	release, err := n.closureSlot()
	if err != nil {
		return 0, err
	}
	defer release()
	share := p.memory.NewShare(int64(maxQueuedChunks)*(int64(contracts.MaxBufferChunkLen(p.opts.ChunkBytes))+4096) + int64(p.opts.ChunkBytes))
	defer share.Close()
	rd := &reader{n: n, share: share, chunks: make(chan queuedChunk, maxQueuedChunks), failed: make(chan struct{})}
	type accepted struct {
		resp contracts.RestoreClosureResponse
		st   feature.Stream
		err  error
	}
	answered := make(chan accepted, 1)
	p.up.Call(contracts.MethodRestoreServiceDatabaseClosure, contracts.EncodeRestoreClosureRequest(r.BackupID, r.ServiceID, n.id),
		func(body json.RawMessage, err error) {
			// On the socket's read loop: the stream is taken before Cloudly's first chunk is read.
			var a accepted
			if a.err = err; err == nil {
				if a.resp, a.err = contracts.ReadRestoreClosureResponse(body); a.err != nil {
					a.err = contracts.RelayRequestInvalid.Refuse("Cloudly's answer to %s: %v", contracts.MethodRestoreServiceDatabaseClosure, a.err)
				} else if a.st, a.err = p.streams.AcceptStream(a.resp.StreamID, share, rd); a.err == nil {
					rd.setStream(a.st)
				}
			}
			answered <- a
		})
	var a accepted
	select {
	case a = <-answered:
	case <-n.ctx.Done():
		return 0, errStopped
	}
	if a.err != nil {
		return 0, a.err
	}
	defer a.st.Close()
	defer rd.drain()
	err = p.cs.PutRestoreClosure(n.ctx, origin, cred, r.BackupID, a.resp.Descriptor, rd)
	if rerr := rd.err(); rerr != nil {
		return rd.total, rerr
	}
	if err != nil {
		rd.fail(err) // Cloudly's chunks still waiting are answered with it (drain)
	}
	return rd.total, err
}

// queuedChunk is one chunk frame read on the socket's read loop, waiting for Corestore.
type queuedChunk struct {
	f    contracts.StreamFrameBody
	size int // the frame's bytes, charged to the share
}

// reader is the relay's end of a restore's stream, and the body of the Corestore PUT.
type reader struct {
	n      *node
	share  feature.Share
	chunks chan queuedChunk // filled on the read loop, emptied by Read
	failed chan struct{}    // closed by fail

	mu      sync.Mutex
	st      feature.Stream // guarded by mu: set on the read loop before any frame arrives
	failure error          // guarded by mu: why the stream was refused or ended early
	closed  bool           // guarded by mu: the restore ended; nothing more is queued

	// Owned by Read (the Corestore request's goroutine).
	buf   []byte
	left  []byte
	total int64
	done  bool
}

func (r *reader) setStream(st feature.Stream) {
	r.mu.Lock()
	r.st = st
	r.mu.Unlock()
}

func (r *reader) stream() feature.Stream {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st
}

func (r *reader) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failure
}

// fail records why the stream ends early, once.
func (r *reader) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failure == nil {
		r.failure = err
		close(r.failed)
	}
}

// StreamFrame takes one of Cloudly's frames on the socket's read loop: keep-alives and feedback
// requests are answered here, chunks queued for Read, charged to the share until Corestore took
// them. It never blocks.
func (r *reader) StreamFrame(frame []byte) {
	p := r.n.p
	f, err := contracts.ReadStreamFrameBody(frame)
	switch {
	case err != nil:
		p.metrics.frames.WithLabelValues("unreadable").Inc()
		return
	case f.Response.Present || !f.Request.Present:
		// An answer (the relay sends no requests on a stream it reads): never answered back,
		// or the two ends would bounce it for ever.
		return
	}
	st := r.stream()
	if st == nil {
		return
	}
	answer := contracts.StreamAnswer{StreamID: st.ID(), CycleID: f.Request.CycleID, Purpose: "feedback", Request: f.RequestRaw}
	if refusal := r.err(); refusal != nil {
		answer.Request, answer.Refusal = nil, asRefusal(refusal)
		st.Send(contracts.AppendStreamAnswer(nil, answer))
		return
	}
	switch f.Request.MainPurpose {
	case "chunk":
		if err := r.queue(f, len(frame)); err != nil {
			r.refuse(st, answer, err)
		}
	case "keepAlive":
		answer.Purpose, answer.KeepAlive = "keepAlive", true
		if f.Request.HasKeepAlive && !f.Request.KeepAlive {
			answer.KeepAlive = false
			r.fail(contracts.RelayUpstreamDetached.Refuse("Cloudly ended the closure's stream before its closing chunk"))
		}
		st.Send(contracts.AppendStreamAnswer(nil, answer))
	default:
		answer.Backpressure = len(r.chunks) >= maxQueuedChunks
		st.Send(contracts.AppendStreamAnswer(nil, answer))
	}
}

// queue holds a chunk for Read, charged to the share, unless the restore has ended.
func (r *reader) queue(f contracts.StreamFrameBody, size int) *contracts.Refusal {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return nil
	case !r.share.Charge(size):
		return contracts.RelayNodeBusy.Refuse("the closure's share of the relay's memory is spent: wait for each chunk's answer")
	}
	select {
	case r.chunks <- queuedChunk{f: f, size: size}:
		return nil
	default:
		r.share.Release(size)
		return contracts.RelayNodeBusy.Refuse("%d chunks of the closure wait already: wait for each chunk's answer", maxQueuedChunks)
	}
}

func (r *reader) refuse(st feature.Stream, a contracts.StreamAnswer, err *contracts.Refusal) {
	r.fail(err)
	a.Request, a.Refusal = nil, err
	st.Send(contracts.AppendStreamAnswer(nil, a))
}

func asRefusal(err error) *contracts.Refusal {
	var ref *contracts.Refusal
	if errors.As(err, &ref) {
		return ref
	}
	return contracts.RelayRequestInvalid.Refuse("the relay ended the closure's stream")
}

// Read is the Corestore request's body: the closure's bytes, chunk by chunk, each chunk answered
// once handed over. It ends at the closing chunk (io.EOF), and fails — aborting the request — when
// the stream ends early, stands still for StreamIdle, or passes the 256 MiB limit.
func (r *reader) Read(b []byte) (int, error) {
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
func (r *reader) next() error {
	p := r.n.p
	idle := time.NewTimer(p.opts.StreamIdle)
	defer idle.Stop()
	st := r.stream()
	var q queuedChunk
	select {
	case q = <-r.chunks:
	case <-r.failed:
		return r.err()
	case <-idle.C:
		err := contracts.RelayClosureStalled.Refuse("Cloudly sent no chunk of the closure for %s", p.opts.StreamIdle)
		r.fail(err)
		return err
	case <-st.Done():
		err := contracts.RelayUpstreamDetached.Refuse("the Cloudly session was lost during the closure")
		r.fail(err)
		return err
	case <-r.n.ctx.Done():
		r.fail(errStopped)
		return errStopped
	}
	data, closing, err := contracts.AppendChunkData(r.buf[:0], q.f.Request.ChunkData)
	r.share.Release(q.size)
	answer := contracts.StreamAnswer{StreamID: st.ID(), CycleID: q.f.Request.CycleID, Purpose: "feedback"}
	switch {
	case err != nil:
		ref := contracts.RelayRequestInvalid.Refuse("a closure chunk in no encoding the library writes")
		r.refuse(st, answer, ref)
		return ref
	case r.total+int64(len(data)) > contracts.MaxCorestoreClosureBytes:
		ref := contracts.RelayRequestInvalid.Refuse("the closure is over the Corestore closure limit of %d bytes", contracts.MaxCorestoreClosureBytes)
		r.refuse(st, answer, ref)
		return ref
	}
	r.buf = data
	r.total += int64(len(data))
	r.left, r.done = data, closing
	if len(data) > 0 {
		p.metrics.bytes.WithLabelValues("to-corestore").Add(float64(len(data)))
	}
	// The chunk is Corestore's once Read returns it: the writer may send the next.
	st.Send(contracts.AppendStreamAnswer(nil, answer))
	return nil
}

// drain releases the charges of chunks still queued when the restore ends, answering each with
// why it ended, so that a writer waiting for one hears it; none is queued after.
func (r *reader) drain() {
	r.mu.Lock()
	r.closed = true
	var left []queuedChunk
	for len(r.chunks) > 0 {
		left = append(left, <-r.chunks)
	}
	failure, st := r.failure, r.st
	r.mu.Unlock()
	for _, q := range left {
		r.share.Release(q.size)
		if st != nil {
			st.Send(contracts.AppendStreamAnswer(nil, contracts.StreamAnswer{StreamID: st.ID(), CycleID: q.f.Request.CycleID,
				Purpose: "feedback", Refusal: asRefusal(failure)}))
		}
	}
}
