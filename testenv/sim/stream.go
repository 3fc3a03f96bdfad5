package sim

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/internal/typedsocket"
)

// Streams are the simulator's side of the published TypedRequest library's VirtualStream
// (docs/protocol.md#streams), as much of it as carrying bytes through the relay needs, on the wire as the library
// puts it there: the peer that put the marker in its body sends chunk frames, each answered by the
// other side before the next is sent; frames carry no envelope correlation, answers are matched by
// cycleId and keep the request's phase; a chunk's answer sets request to null; the last chunk
// carries the closing bit. Chunk data travels as base64 strings (the library sends a Uint8Array's
// JSON form; the relay reads neither).
//
// A stream whose path is gone is forgotten at once (abandon: Cloudly's socket ended, or the relay
// said it detached); one nobody waits for — its request was lost, or its receiver gave up before
// the closing chunk — streamLinger after its last chunk. A long run keeps only the streams in
// flight.
type streams struct {
	mu        sync.Mutex
	answers   map[string]chan struct{} // guarded by mu: cycleId → closed when answered
	incoming  map[string]*inbound      // guarded by mu: streamId → bytes received so far
	waiters   map[string]chan []byte   // guarded by mu: streamId → gets the bytes once closed
	closed    map[string]*inbound      // guarded by mu: streams closed before anyone waited
	tap       func(frame []byte)       // guarded by mu: sees every stream frame as it arrived, when set
	sinks     map[string]streamSink    // guarded by mu: streams a side of its own takes whole (the platform's)
	lastSweep time.Time                // guarded by mu

	completed atomic.Int64 // streams received whole
	pace      atomic.Int64 // nanoseconds to wait between two chunks sent (a slow writer)
}

// inbound is a stream's bytes so far and when its last chunk came.
type inbound struct {
	data []byte
	last time.Time
}

// streamLinger is how long a stream nobody waits for is kept after its last chunk: as long as a
// receiver waits for one (typedsocket.DefaultCallTimeout).
const streamLinger = typedsocket.DefaultCallTimeout

func newStreams() *streams {
	return &streams{answers: make(map[string]chan struct{}), incoming: make(map[string]*inbound), sinks: make(map[string]streamSink),
		waiters: make(map[string]chan []byte), closed: make(map[string]*inbound), lastSweep: time.Now()}
}

// abandon forgets every stream being received and every one closed that nobody asked for: they
// came over a path that is gone (Cloudly's socket ended, or the relay said it detached), and no
// more of them will arrive.
func (s *streams) abandon() {
	s.mu.Lock()
	clear(s.incoming)
	clear(s.closed)
	s.mu.Unlock()
}

// sweepLocked forgets the streams whose last chunk came more than streamLinger ago; at most once
// a second.
func (s *streams) sweepLocked(now time.Time) {
	if now.Sub(s.lastSweep) < time.Second {
		return
	}
	s.lastSweep = now
	for _, m := range []map[string]*inbound{s.incoming, s.closed} {
		for id, in := range m {
			if now.Sub(in.last) > streamLinger {
				delete(m, id)
			}
		}
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

// streamCycle is the request or response member of a stream frame.
type streamCycle struct {
	StreamID     string  `json:"streamId"`
	CycleID      string  `json:"cycleId"`
	Cycle        string  `json:"cycle"`
	MainPurpose  string  `json:"mainPurpose"`
	Next         bool    `json:"next"`
	Backpressure bool    `json:"backpressure"`
	ChunkData    *string `json:"chunkData,omitempty"`
}

type streamFrame struct {
	Method   string       `json:"method"`
	Request  *streamCycle `json:"request"`
	Response *streamCycle `json:"response"`
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

// serve takes one stream frame from the connection: a frame of a stream a sink takes, an answer
// to a chunk this side sent, or a chunk of a stream the other side sends, which it answers.
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
	var fr streamFrame
	if json.Unmarshal(f.Frame, &fr) != nil {
		return
	}
	if fr.Response != nil && fr.Response.Cycle == "response" {
		s.mu.Lock()
		ch := s.answers[fr.Response.CycleID]
		delete(s.answers, fr.Response.CycleID)
		s.mu.Unlock()
		if ch != nil {
			close(ch)
		}
		return
	}
	if fr.Request == nil || fr.Request.Cycle != "request" {
		return
	}
	req := fr.Request
	if req.MainPurpose == "chunk" && req.ChunkData != nil {
		s.chunk(req.StreamID, *req.ChunkData)
	}
	answer, _ := json.Marshal(streamFrame{Method: contracts.MethodVirtualStream, Response: &streamCycle{
		StreamID: req.StreamID, CycleID: req.CycleID, Cycle: "response", MainPurpose: "feedback"}})
	c.SendFrame(answer)
}

func (s *streams) chunk(id, data string) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(now)
	in := s.incoming[id]
	if in == nil {
		in = &inbound{}
	}
	in.last = now
	if data == contracts.StreamClosingBit {
		delete(s.incoming, id)
		s.completed.Add(1)
		if w := s.waiters[id]; w != nil {
			delete(s.waiters, id)
			w <- in.data
		} else {
			s.closed[id] = in
		}
		return
	}
	b, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return
	}
	in.data = append(in.data, b...)
	s.incoming[id] = in
}

// send writes data to the stream in chunks of chunkSize, each answered before the next, then the
// closing chunk.
func (s *streams) send(ctx context.Context, c *typedsocket.Conn, id string, data []byte, chunkSize int) error {
	for len(data) > 0 {
		if pace := time.Duration(s.pace.Load()); pace > 0 {
			select {
			case <-time.After(pace):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		n := min(chunkSize, len(data))
		if err := s.sendChunk(ctx, c, id, base64.StdEncoding.EncodeToString(data[:n]), len(data) > n); err != nil {
			return err
		}
		data = data[n:]
	}
	return s.sendChunk(ctx, c, id, contracts.StreamClosingBit, false)
}

func (s *streams) sendChunk(ctx context.Context, c *typedsocket.Conn, id, chunk string, next bool) error {
	cycle := newStreamID()
	frame, _ := json.Marshal(streamFrame{Method: contracts.MethodVirtualStream, Request: &streamCycle{
		StreamID: id, CycleID: cycle, Cycle: "request", MainPurpose: "chunk", Next: next, ChunkData: &chunk}})
	answered := make(chan struct{})
	s.mu.Lock()
	s.answers[cycle] = answered
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.answers, cycle)
		s.mu.Unlock()
	}()
	if err := c.SendFrame(frame); err != nil {
		return fmt.Errorf("stream %s: %w", id, err)
	}
	select {
	case <-answered:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stream %s: no answer to a chunk: %w", id, context.Cause(ctx))
	}
}

// receive waits until the stream has been closed and returns its bytes.
func (s *streams) receive(ctx context.Context, id string) ([]byte, error) {
	s.mu.Lock()
	if got, ok := s.closed[id]; ok {
		delete(s.closed, id)
		s.mu.Unlock()
		return got.data, nil
	}
	w := make(chan []byte, 1)
	s.waiters[id] = w
	s.mu.Unlock()
	select {
	case got := <-w:
		return got, nil
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.waiters, id)
		delete(s.incoming, id)
		s.mu.Unlock()
		return nil, fmt.Errorf("stream %s not closed: %w", id, context.Cause(ctx))
	}
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
	if _, err := c.CallAsync(MethodPushImageVersion, body, func(r typedsocket.Reply) { answer <- r }); err != nil {
		return err
	}
	if err := s.send(ctx, c, id, data, chunkSize); err != nil {
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
