package sim

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
	"code.foss.global/serve.zone/relay/internal/vstream"
)

// Streams are the simulator's side of the published TypedRequest library's VirtualStream
// (docs/protocol.md#streams). The carriage itself — chunk frames each answered before the next,
// answers matched by cycleId, keep-alives, the closing chunk, the chunk encodings — is
// internal/vstream's, the same code the platform agent streams with; what is here is the
// simulator's policy on top of it:
//
//   - a stream is read from its first chunk, whether or not the request carrying its marker has
//     arrived (typedsocket serves stream frames and requests on different paths), and its bytes are
//     kept until a receiver asks for them;
//   - a request frame of a stream this side keeps no end of (a keep-alive, a feedback request)
//     is answered as an open stream would answer it (vstream.Answer): the relay's tests read
//     those answers;
//   - a stream whose path is gone is forgotten at once (abandon: Cloudly's socket ended, or the
//     relay said it detached); one nobody waits for — its request was lost, or its receiver gave
//     up before the closing chunk — streamLinger after its last chunk. A long run keeps only the
//     streams in flight;
//   - sinks (a side of its own takes a stream's frames whole: the platform stand-in's), a tap that
//     sees every frame, and a pace between the chunks this side writes.
type streams struct {
	mu        sync.Mutex
	readers   map[string]*vstream.Reader // guarded by mu: streams being read, by streamId
	waiters   map[string]chan received   // guarded by mu: streamId → gets the stream once it ended
	closed    map[string]*closedStream   // guarded by mu: streams read whole before anyone waited
	stop      chan struct{}              // guarded by mu: closed by abandon, for the readers it began
	tap       func(frame []byte)         // guarded by mu: sees every stream frame as it arrived, when set
	sinks     map[string]streamSink      // guarded by mu: streams an end takes whole (writers, readers, the platform's)
	lastSweep time.Time                  // guarded by mu

	completed atomic.Int64 // streams received whole
	pace      atomic.Int64 // nanoseconds to wait between two chunks sent (a slow writer)
	idle      atomic.Int64 // nanoseconds a reader waits for the next chunk; 0: streamLinger
	// kept is the memory this side holds of streams' bytes: those being read, and those read whole
	// that nobody has asked for yet. It is there by design (until the receiver asks, the path ends
	// or streamLinger passes), and a heap measurement that judges the relay subtracts it.
	kept atomic.Int64
}

// received is a stream's bytes once it ended, or why it ended early.
type received struct {
	data []byte
	err  error
}

// closedStream is a stream read whole and when it ended.
type closedStream struct {
	data []byte // its capacity is counted in streams.kept
	at   time.Time
}

// keptBuffer collects a stream's bytes and counts the memory they take in kept as it grows. Only
// Write is offered, so io.Copy writes through it rather than reading into the buffer behind it.
type keptBuffer struct {
	buf  bytes.Buffer
	kept *atomic.Int64
}

func (k *keptBuffer) Write(p []byte) (int, error) {
	was := k.buf.Cap()
	n, err := k.buf.Write(p)
	k.kept.Add(int64(k.buf.Cap() - was))
	return n, err
}

// streamLinger is how long a stream nobody waits for is kept after its last chunk: as long as a
// receiver waits for one (typedsocket.DefaultCallTimeout).
const streamLinger = typedsocket.DefaultCallTimeout

func newStreams() *streams {
	return &streams{readers: make(map[string]*vstream.Reader), sinks: make(map[string]streamSink),
		waiters: make(map[string]chan received), closed: make(map[string]*closedStream), stop: make(chan struct{}), lastSweep: time.Now()}
}

// abandon forgets every stream being read and every one read that nobody asked for: they came
// over a path that is gone (Cloudly's socket ended, or the relay said it detached), and no more
// of them will arrive.
func (s *streams) abandon() {
	s.mu.Lock()
	close(s.stop)
	s.stop = make(chan struct{})
	for id := range s.closed {
		s.forgetLocked(id)
	}
	s.mu.Unlock()
}

// sweepLocked forgets the streams read whole more than streamLinger ago that nobody asked for;
// at most once a second. (A stream still being read ends by its reader's idle bound.)
func (s *streams) sweepLocked(now time.Time) {
	if now.Sub(s.lastSweep) < time.Second {
		return
	}
	s.lastSweep = now
	for id, c := range s.closed {
		if now.Sub(c.at) > streamLinger {
			s.forgetLocked(id)
		}
	}
}

// forgetLocked drops a stream read whole and its bytes.
func (s *streams) forgetLocked(id string) {
	if c, ok := s.closed[id]; ok {
		s.kept.Add(-int64(cap(c.data)))
		delete(s.closed, id)
	}
}

// streamMarker is the body member that carries a stream: { "_isVirtualStream": true, "streamId" }.
func streamMarker(id string) map[string]any {
	return map[string]any{"_isVirtualStream": true, "streamId": id}
}

func newStreamID() string {
	var b [12]byte
	rand.Read(b[:])
	return "sim-stream-" + hex.EncodeToString(b[:])
}

// streamSink takes every frame of one stream, on the read loop; it must not block.
type streamSink func(c *typedsocket.Conn, frame []byte)

func (s *streams) setSink(id string, f streamSink) {
	s.mu.Lock()
	s.sinks[id] = f
	s.mu.Unlock()
}

func (s *streams) dropSink(id string) {
	s.mu.Lock()
	delete(s.sinks, id)
	s.mu.Unlock()
}

// serve takes one stream frame from the connection: a frame of a stream an end on this side
// holds (a writer's answer, a reader's chunk), the first chunk of a stream the other side
// writes, which begins its reader, or a request of a stream this side keeps no end of, answered.
func (s *streams) serve(c *typedsocket.Conn, f *typedsocket.StreamFrame) {
	s.mu.Lock()
	tap, sink := s.tap, s.sinks[f.StreamID]
	s.mu.Unlock()
	if tap != nil {
		tap(f.Frame)
	}
	if sink != nil {
		sink(c, f.Frame)
		return
	}
	body, err := contracts.ReadStreamFrameBody(f.Frame)
	if err != nil {
		return
	}
	if body.Request.Present && !body.Response.Present && body.Request.MainPurpose == "chunk" && body.Request.StreamID == f.StreamID {
		s.read(simLink{c, f.StreamID}).StreamFrame(f.Frame)
		return
	}
	if answer, ok := vstream.Answer(f.Frame); ok {
		c.SendFrame(answer)
	}
}

// read begins reading the stream on l: its reader takes the stream's frames from now on, and
// its bytes are kept for receive once it ended.
func (s *streams) read(l vstream.Link) *vstream.Reader {
	id := l.ID()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(time.Now())
	if rd := s.readers[id]; rd != nil { // a frame raced the sink's setting
		return rd
	}
	idle := time.Duration(s.idle.Load())
	if idle <= 0 {
		idle = streamLinger
	}
	rd := vstream.NewReader(vstream.ReaderOptions{Idle: idle, Stop: s.stop, Peer: "the writer"})
	rd.Attach(l)
	s.readers[id] = rd
	s.sinks[id] = func(_ *typedsocket.Conn, frame []byte) { rd.StreamFrame(frame) }
	go func() {
		got := keptBuffer{kept: &s.kept}
		_, err := io.Copy(&got, rd)
		rd.Close()
		kept := int64(got.buf.Cap())
		now := time.Now()
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.readers, id)
		delete(s.sinks, id)
		if err == nil {
			s.completed.Add(1)
		}
		if w := s.waiters[id]; w != nil {
			delete(s.waiters, id)
			s.kept.Add(-kept)
			w <- received{got.buf.Bytes(), err}
			return
		}
		if err != nil {
			s.kept.Add(-kept)
			return
		}
		s.sweepLocked(now)
		s.closed[id] = &closedStream{data: got.buf.Bytes(), at: now}
	}()
	return rd
}

// receive waits until the stream has been read whole and returns its bytes.
func (s *streams) receive(ctx context.Context, id string) ([]byte, error) {
	s.mu.Lock()
	if got, ok := s.closed[id]; ok {
		s.forgetLocked(id)
		s.mu.Unlock()
		return got.data, nil
	}
	w := make(chan received, 1)
	s.waiters[id] = w
	s.mu.Unlock()
	select {
	case got := <-w:
		if got.err != nil {
			return nil, fmt.Errorf("stream %s not closed: %w", id, got.err)
		}
		return got.data, nil
	case <-ctx.Done():
		err := context.Cause(ctx)
		s.mu.Lock()
		delete(s.waiters, id)
		rd := s.readers[id]
		s.mu.Unlock()
		if rd != nil {
			rd.Fail(contracts.RelayRequestInvalid.Refuse("the receiver gave up on the stream"))
		}
		return nil, fmt.Errorf("stream %s not closed: %w", id, err)
	}
}

// send writes data to the stream as the library's writer does (vstream), chunkSize bytes a
// chunk, each answered before the next, then the closing chunk; ended, when closed, says the
// call carrying the stream was answered.
func (s *streams) send(ctx context.Context, c *typedsocket.Conn, id string, data []byte, chunkSize int, ended <-chan struct{}) error {
	w := vstream.NewWriter(vstream.WriterOptions{ChunkBytes: chunkSize, Stop: ctx.Done(), Ended: ended, Peer: "the receiver"})
	s.setSink(id, func(_ *typedsocket.Conn, frame []byte) { w.StreamFrame(frame) })
	defer s.dropSink(id)
	_, err := w.Write(simLink{c, id}, &pacedReader{ctx: ctx, pace: &s.pace, r: bytes.NewReader(data)})
	if errors.Is(err, vstream.ErrStopped) {
		err = context.Cause(ctx)
	}
	if err != nil {
		return fmt.Errorf("stream %s: %w", id, err)
	}
	return nil
}

// pacedReader waits pace before each read: the writer reads one chunk at a time, so that is a
// wait between two chunks sent (a slow writer).
type pacedReader struct {
	ctx  context.Context
	pace *atomic.Int64
	r    io.Reader
}

func (p *pacedReader) Read(b []byte) (int, error) {
	if d := time.Duration(p.pace.Load()); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-p.ctx.Done():
			return 0, context.Cause(p.ctx)
		}
	}
	return p.r.Read(b)
}

// The method the simulator streams with: the seeds' example of a request-side stream
// (requests.image.IRequest_PushImageVersion.request.imageStream).
const MethodPushImageVersion = "pushImageVersion"

// imageDigest is what the receiver of an image stream answers: the stream integrity the seeds
// build ({ algorithm, byteLength, digest }).
func imageDigest(b []byte) map[string]any {
	sum := sha256.Sum256(b)
	return map[string]any{"algorithm": "sha256", "byteLength": len(b), "digest": "sha256:" + hex.EncodeToString(sum[:])}
}

// errStreamMismatch is an image stream that arrived other than it was sent.
var errStreamMismatch = errors.New("sim: the stream's bytes did not arrive as sent")

// markerID reads the one stream id of a body's imageStream marker.
func markerID(body []byte) (string, error) {
	var id string
	contracts.FindStreamMarkers(body, func(s string) error { id = s; return nil })
	if id == "" {
		return "", errors.New("the body carries no stream marker")
	}
	return id, nil
}

// receiveImage answers a pushImageVersion request once its stream has arrived whole: with the
// stream's integrity, as the seeds' receivers do. It runs on its own goroutine: the read loop
// must go on reading the stream's chunks.
func (s *streams) receiveImage(body json.RawMessage, reply func(json.RawMessage, error)) {
	id, err := markerID(body)
	if err != nil {
		reply(nil, &typedsocket.Error{Text: "request-invalid: " + err.Error(), Data: json.RawMessage("null")})
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), typedsocket.DefaultCallTimeout)
		defer cancel()
		got, err := s.receive(ctx, id)
		if err != nil {
			reply(nil, &typedsocket.Error{Text: "stream-incomplete: " + err.Error(), Data: json.RawMessage("null")})
			return
		}
		b, _ := json.Marshal(imageDigest(got))
		reply(b, nil)
	}()
}

// pushImage sends a pushImageVersion request carrying a fresh stream on c, streams data in it
// while the request is pending, and checks the receiver's answer names exactly those bytes. The
// request is queued before the first chunk, so the relay binds the stream before any frame.
func (s *streams) pushImage(ctx context.Context, c *typedsocket.Conn, session json.RawMessage, data []byte, chunkSize int) error {
	if c == nil {
		return errors.New("not connected")
	}
	id := newStreamID()
	body, _ := json.Marshal(map[string]any{"session": session, "imageStream": streamMarker(id), "byteLength": len(data)})
	answer := make(chan typedsocket.Reply, 1)
	ended := make(chan struct{})
	if _, err := c.CallAsync(MethodPushImageVersion, body, func(r typedsocket.Reply) { answer <- r; close(ended) }); err != nil {
		return err
	}
	if err := s.send(ctx, c, id, data, chunkSize, ended); err != nil && !errors.Is(err, vstream.ErrEndedEarly) {
		return err
	}
	select {
	case r := <-answer:
		if r.Err != nil {
			return r.Err
		}
		want, _ := json.Marshal(imageDigest(data))
		if !contracts.EqualJSON(r.Response, want) {
			return errStreamMismatch
		}
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
