package typedsocket

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
)

// Defaults of docs/protocol.md#framing-typedrequest-over-websocket. A zero Options field means its default.
const (
	DefaultPingInterval  = 15 * time.Second
	DefaultDeadTimeout   = 45 * time.Second
	DefaultCallTimeout   = 60 * time.Second
	DefaultReadLimit     = 64 << 10 // before registration: an anonymous peer holds no large buffer
	DefaultMaxQueue      = 256
	DefaultMaxQueueBytes = 16 << 20
	DefaultMaxInflight   = 1024
)

// Local failures of a call. A remote failure is an *Error.
var (
	ErrClosed    = errors.New("typedsocket: connection closed")
	ErrTimeout   = errors.New("typedsocket: no answer within the call timeout")
	ErrQueueFull = errors.New("typedsocket: send queue full")
	// ErrOverShare is a request or frame whose bytes do not fit the share it is charged to.
	ErrOverShare = errors.New("typedsocket: over the peer's share of the memory budget")
	// ErrMalformedAnswer is an answer whose envelope could be correlated but not read.
	ErrMalformedAnswer = errors.New("typedsocket: malformed answer")
)

// Handler serves the peer's requests. ServeRequest runs on the connection's read loop: it must not
// block, and must answer r exactly once, now or later from any goroutine. Dispatching requests on
// the read loop is what keeps each peer's requests in the order it sent them.
type Handler interface {
	ServeRequest(c *Conn, r *Request)
}

// StreamHandler takes the peer's VirtualStream frames (docs/protocol.md#streams) on the read loop, in the order
// the peer sent them. It must not block.
type StreamHandler interface {
	ServeStream(c *Conn, f *StreamFrame)
}

// StreamHandlerFunc adapts a function to StreamHandler.
type StreamHandlerFunc func(c *Conn, f *StreamFrame)

// ServeStream calls f.
func (f StreamHandlerFunc) ServeStream(c *Conn, sf *StreamFrame) { f(c, sf) }

// StreamFrame is one VirtualStream frame as read: routed by StreamID, forwarded whole.
type StreamFrame struct {
	StreamID string
	ID       string // correlation.id; "" when the frame carries none
	Phase    Phase  // correlation.phase; 0 without a correlation
	Closing  bool   // the frame carries the library's closing chunk
	Frame    []byte // the whole frame, to forward untouched
	// RelayNodeID: the frame carries an envelope relayNodeId member (Envelope.RelayNodeRaw), which
	// a relay forwarding it for a peer strips (WithoutRelayNodeID).
	RelayNodeID bool
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(c *Conn, r *Request)

// ServeRequest calls f.
func (f HandlerFunc) ServeRequest(c *Conn, r *Request) { f(c, r) }

// Options configure a Conn.
type Options struct {
	Handler       Handler             // nil answers every request relay-method-unknown
	PingInterval  time.Duration       // WebSocket ping cadence (15 s)
	DeadTimeout   time.Duration       // a peer silent this long is gone; also bounds one write (45 s)
	CallTimeout   time.Duration       // per-call default (60 s)
	ReadLimit     int64               // largest message read (64 KiB); raise with SetReadLimit
	MaxQueue      int                 // requests queued for sending (256)
	MaxQueueBytes int                 // bytes queued for sending (16 MiB)
	MaxInflight   int                 // peer requests being served at once (1024)
	BusyError     error               // the answer beyond MaxInflight (relay-node-busy)
	Share         Share               // charged for what this connection holds for its peer; nil: nothing charged
	Streams       StreamHandler       // nil answers every stream frame relay-stream-unknown
	Dropped       func(reason string) // counts a frame dropped without an answer; nil: not counted
	Cork          *CorkConn           // the socket under the WebSocket, if wrapped: bursts leave in one write
	Raw           net.Conn            // the socket under the WebSocket, if known: bounds a refusing close
	Pongs         *Pongs              // the ping answering the WebSocket was built with, if any (see Pongs)
	Pace          *Pace               // how long a message may take to arrive; nil: no bound (SetPace)
	Logger        zerolog.Logger      // component logger; bodies are never logged

	// Judge judges every message by the method it requests before it is served: "" for anything
	// that is not a well-formed request (an answer, a stream frame, a binary message, a frame that
	// does not decode). false ends the connection there: that message and none after it is read
	// or answered, what was already queued is written (at most a second), and the socket is
	// closed without a close handshake. nil: every message is served.
	Judge func(method string) bool

	// afterTake, in tests, runs on the send loop once it has taken what is queued, before it
	// writes it.
	afterTake func()
}

func (o *Options) fill() {
	if o.PingInterval <= 0 {
		o.PingInterval = DefaultPingInterval
	}
	if o.DeadTimeout <= 0 {
		o.DeadTimeout = DefaultDeadTimeout
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.ReadLimit <= 0 {
		o.ReadLimit = DefaultReadLimit
	}
	if o.MaxQueue <= 0 {
		o.MaxQueue = DefaultMaxQueue
	}
	if o.MaxQueueBytes <= 0 {
		o.MaxQueueBytes = DefaultMaxQueueBytes
	}
	if o.MaxInflight <= 0 {
		o.MaxInflight = DefaultMaxInflight
	}
	if o.BusyError == nil {
		o.BusyError = contracts.RelayNodeBusy.Refuse("too many requests in flight on this connection")
	}
}

// Reply is the outcome of a call: the answer's body, or an error — an *Error from the peer or a
// local ErrClosed, ErrTimeout. Retry is the answer's raw retry hint, if any.
type Reply struct {
	Response json.RawMessage
	Err      error
	Retry    json.RawMessage
	// Charge, on an answer, is the share that holds its bytes until written (docs/hostile.md): the
	// downstream peer the answer comes from. nil: the connection's own Options.Share.
	Charge Share
	// Wait, on an answer charged to Charge, makes the answer wait for room in that share instead
	// of being refused, until Wait or this connection ends: set by whoever answers on the read
	// loop of the peer the share is, so that the peer's further bytes wait on its own socket.
	Wait <-chan struct{}
}

// Conn is one TypedRequest peer on a WebSocket: it calls and serves concurrently. One read loop
// reads and dispatches every message, one send loop writes every frame from a bounded queue; a
// slow peer fills its own queue and never blocks a caller.
type Conn struct {
	ws   *websocket.Conn // set at construction
	opts Options         // set at construction

	ctx    context.Context         // set at construction; cancelled with the close cause
	cancel context.CancelCauseFunc // set at construction

	sendq sendQueue

	mu      sync.Mutex
	pending map[string]*call // guarded by mu
	nextID  uint64           // guarded by mu
	closed  bool             // guarded by mu: no new calls

	readLimit atomic.Int64          // the largest message read: a message buffer grows no further
	receive   atomic.Pointer[Share] // where a message being received is charged; nil: Options.Share
	inflight  atomic.Int64          // peer requests whose answer is not yet written
	lastHeard atomic.Int64          // unix nanos of the last message or pong
	pinging   atomic.Bool           // a ping is outstanding
	writing   atomic.Bool           // the send loop is inside a write
	progress  atomic.Int64          // unix nanos of the write's start or its last frame written; 0 outside a write
	pingWG    sync.WaitGroup
	done      chan struct{} // closed when Run has returned

	pace      atomic.Pointer[Pace] // the bound on a message's arrival; nil: none
	paceDue   atomic.Int64         // unix nanos by which the message being read must be in; 0: none
	paceTimer *time.Timer          // read loop only: ends the connection at paceDue
	messages  int                  // read loop only: messages read whole

	writtenMu sync.Mutex
	written   chan struct{} // guarded by writtenMu: closed when the send loop next finishes a write; nil: nobody waits
}

// New wraps an accepted or dialled WebSocket. Call Run to serve it.
func New(ws *websocket.Conn, opts Options) *Conn {
	opts.fill()
	ctx, cancel := context.WithCancelCause(context.Background())
	c := &Conn{ws: ws, opts: opts, ctx: ctx, cancel: cancel, pending: make(map[string]*call), done: make(chan struct{})}
	c.sendq.init(opts.MaxQueue, opts.MaxQueueBytes)
	c.SetReadLimit(opts.ReadLimit)
	c.pace.Store(opts.Pace)
	c.lastHeard.Store(time.Now().UnixNano())
	if opts.Pongs != nil {
		opts.Pongs.c.Store(c)
	}
	return c
}

// SetReadLimit changes the largest message the connection reads; a larger one closes it with
// status 1009. Safe from any goroutine.
func (c *Conn) SetReadLimit(n int64) { c.readLimit.Store(n); c.ws.SetReadLimit(n) }

// Context is cancelled when the connection ends; its cause is why.
func (c *Conn) Context() context.Context { return c.ctx }

// Done is closed when Run has returned and every pending call has been answered.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Inflight is the number of the peer's requests whose answer has not been written yet.
func (c *Conn) Inflight() int64 { return c.inflight.Load() }

// Pending is the number of this side's calls whose answer has not come yet, queued or sent.
func (c *Conn) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// Pongs decides, for the WebSocket library, whether to answer a peer's ping (the library's
// OnPingReceived option, in websocket.AcceptOptions or DialOptions); the connection built with
// Options.Pongs set to it sets it up. The library writes the pong from the read loop and ends the
// connection when that takes five seconds, so a peer that pings while it reads slowly — Cloudly
// under load, with the relay's writes to it backed up — would cost its whole session five seconds
// into the backlog. While a write of ours has not moved for pongStall the ping goes unanswered
// instead: the peer is not reading what we send, a pong would only queue behind it, and every
// byte that does reach it shows we are alive.
type Pongs struct{ c atomic.Pointer[Conn] }

// pongStall is how long a write may have not moved before a ping goes unanswered.
const pongStall = time.Second

// OnPingReceived reports whether the library should answer this ping.
func (g *Pongs) OnPingReceived(context.Context, []byte) bool {
	c := g.c.Load()
	if c == nil {
		return true
	}
	p := c.progress.Load()
	if p != 0 && time.Now().UnixNano()-p > int64(pongStall) {
		c.dropped("pong-skipped")
		return false
	}
	return true
}

// Stalled reports whether the peer is not reading: a write to it is under way and not one frame
// of it has left for d. Only a write can wait on the peer. Frames merely queued wait for the send
// loop, which takes them as soon as it runs: while it writes a long batch to a peer that reads
// slowly, or while this process is not scheduled, they age without the peer being at fault (a
// starved relay once judged its honest nodes stalled so, and evicted them).
func (c *Conn) Stalled(d time.Duration) bool {
	p := c.progress.Load()
	return p != 0 && time.Now().UnixNano()-p > int64(d)
}

// QueuedBytes is what the frames waiting to be written hold.
func (c *Conn) QueuedBytes() int { return c.sendq.queuedBytes() }

// QueueLen is the number of frames waiting to be written.
func (c *Conn) QueueLen() int { return c.sendq.len() }

// Run serves the connection until it ends or ctx is cancelled, and returns why. It reads on the
// calling goroutine and writes on one more, which is all a connection costs.
func (c *Conn) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { c.cancel(context.Cause(ctx)) })
	defer stop()
	// Reads and writes run under context.Background(): a per-call context costs a registration on
	// the parent and a timer for every message. Cancelling the connection closes the socket
	// instead, which ends a blocked read or write just the same.
	closeOnCancel := context.AfterFunc(c.ctx, func() { c.ws.CloseNow() })
	defer closeOnCancel()

	sendErr := make(chan error, 1)
	go func() {
		err := c.sendLoop()
		c.cancel(err)
		sendErr <- err
	}()
	c.cancel(c.readLoop())
	<-sendErr
	c.pingWG.Wait()
	c.ws.CloseNow()
	c.shutdown()
	close(c.done)
	return context.Cause(c.ctx) // whichever loop ended first says why
}

// Close ends the connection with a close handshake, after writing what is queued (waiting at
// most a second for it), so answers already given are not lost to the close.
func (c *Conn) Close(code websocket.StatusCode, reason string) error {
	if !c.drained(time.Second) {
		// The peer drains nothing: it would not read a close frame either, and a handshake with it
		// would hold the close for the library's own timeouts.
		c.CloseNow()
		return nil
	}
	err := c.ws.Close(code, reason)
	c.cancel(fmt.Errorf("%w: closed locally (%d %s)", ErrClosed, code, reason))
	return err
}

// drained waits until nothing is queued or being written, at most d or until the connection ends,
// and reports whether that is so: it wakes each time the send loop finishes a write.
func (c *Conn) drained(d time.Duration) bool {
	pending := func() bool { return c.sendq.len() > 0 || c.writing.Load() }
	if !pending() {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		next := c.nextWrite() // before the look: a write that ends after it closes this one
		if !pending() {
			return true
		}
		select {
		case <-next:
		case <-timer.C:
			return !pending()
		case <-c.ctx.Done():
			return !pending()
		}
	}
}

// nextWrite is closed when the send loop next finishes a write.
func (c *Conn) nextWrite() <-chan struct{} {
	c.writtenMu.Lock()
	defer c.writtenMu.Unlock()
	if c.written == nil {
		c.written = make(chan struct{})
	}
	return c.written
}

// wroteOne wakes whoever waits for a write to finish.
func (c *Conn) wroteOne() {
	c.writtenMu.Lock()
	if c.written != nil {
		close(c.written)
		c.written = nil
	}
	c.writtenMu.Unlock()
}

// Evict ends the connection at once and drops what is queued for it, its charges released before
// Evict returns: the memory budget needs the bytes back now, not when the loops notice. It never
// blocks.
func (c *Conn) Evict() {
	c.cancel(fmt.Errorf("%w: evicted over the memory budget", ErrClosed))
	c.inflight.Add(-int64(c.sendq.close()))
	go c.ws.CloseNow()
}

// refusedLinger bounds the writing of what is queued to a peer whose message the judge refused.
const refusedLinger = time.Second

// misbehavingLinger bounds the writing of the close frame to a peer the connection refuses.
const misbehavingLinger = 250 * time.Millisecond

// closeMisbehaving closes with code and reason, when the socket under the WebSocket is known
// without waiting for the peer's close frame: the WebSocket library would otherwise read and
// discard, a byte at a time, whatever the peer sends for up to five seconds, holding the
// connection and its place that long; under the hostile-load fault that reading was a tenth of the
// relay's CPU (a flooder's unread junk). The close frame is still written, so a peer that reads
// learns why.
func (c *Conn) closeMisbehaving(code websocket.StatusCode, reason string) {
	if c.opts.Raw != nil {
		c.opts.Raw.SetWriteDeadline(time.Now().Add(misbehavingLinger))
		c.opts.Raw.SetReadDeadline(time.Now()) // past: the close handshake reads nothing
	}
	c.ws.Close(code, reason)
}

// CloseNow ends the connection without a handshake.
func (c *Conn) CloseNow() {
	c.cancel(fmt.Errorf("%w: closed locally", ErrClosed))
	c.ws.CloseNow()
}

func (c *Conn) readLoop() error {
	defer func() {
		if c.paceTimer != nil {
			c.paceTimer.Stop()
		}
	}()
	for {
		typ, frame, share, charged, err := c.readMessage()
		if err != nil {
			return err
		}
		// Read whole, the message is served at once, on this loop; what serving it leaves queued
		// is charged where it waits.
		releaseTo(share, charged)
		if err := c.serveMessage(typ, frame); err != nil {
			return err
		}
	}
}

// readChunk is the least a message buffer grows by.
const readChunk = 4 << 10

// readMessage reads the next message whole. With a share, the buffer a message is read into is
// charged before each growth, so a peer that withholds a message's last byte holds only what the
// budget allowed (docs/hostile.md: no byte outside the budget); the caller releases what it returns as
// charged. While the pool has no room the read waits, so the peer's bytes wait on its own socket.
// The share's cap does not stop a read: a request past it is refused by name once read.
func (c *Conn) readMessage() (websocket.MessageType, []byte, Share, int, error) {
	typ, r, err := c.ws.Reader(context.Background())
	if err != nil {
		return 0, nil, nil, 0, err
	}
	share := c.opts.Share
	if p := c.receive.Load(); p != nil {
		share = *p
	}
	pc := c.startPace()
	defer pc.stop()
	var buf []byte
	charged := 0
	for {
		if len(buf) == cap(buf) {
			grown := int(min(int64(max(2*cap(buf), readChunk)), c.readLimit.Load()+1))
			if share != nil {
				pc.pause()
				ok := c.chargeIncoming(share, grown-charged)
				pc.resume()
				if !ok {
					releaseTo(share, charged)
					return 0, nil, nil, 0, context.Cause(c.ctx)
				}
				charged = grown
			}
			nb := make([]byte, len(buf), grown)
			copy(nb, buf)
			buf = nb
		}
		pc.arm(len(buf))
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			c.messages++
			return typ, buf, share, charged, nil
		}
		if err != nil {
			releaseTo(share, charged)
			if errors.Is(context.Cause(c.ctx), ErrTooSlow) {
				return 0, nil, nil, 0, context.Cause(c.ctx)
			}
			return 0, nil, nil, 0, err
		}
	}
}

func releaseTo(s Share, n int) {
	if n > 0 {
		s.Release(n)
	}
}

// SetReceiveShare charges the messages the connection receives from now on to s instead of
// Options.Share: a connection that has not registered has its incoming bytes bound with every
// other such connection's.
func (c *Conn) SetReceiveShare(s Share) { c.receive.Store(&s) }

// serveMessage serves one message read whole; an error ends the connection.
func (c *Conn) serveMessage(typ websocket.MessageType, frame []byte) error {
	if c.ctx.Err() != nil { // ending: serve nothing more that was already buffered
		return context.Cause(c.ctx)
	}
	c.lastHeard.Store(time.Now().UnixNano())
	var env Envelope
	var err error
	if typ == websocket.MessageText {
		env, err = Decode(frame)
	}
	if c.opts.Judge != nil {
		method := ""
		if typ == websocket.MessageText && err == nil && env.Phase == PhaseRequest && !env.IsStream() {
			method = env.Method
		}
		if !c.opts.Judge(method) {
			// Nothing more is read; answers already queued (to messages the judge let through)
			// are written first, at most refusedLinger, and the socket closed without a handshake.
			err := fmt.Errorf("%w: message %d (%s) is refused", ErrClosed, c.messages, fieldOr(method, "not a request"))
			c.drained(refusedLinger)
			c.cancel(err)
			return err
		}
	}
	if typ != websocket.MessageText {
		c.closeMisbehaving(websocket.StatusUnsupportedData, "TypedRequest envelopes are text messages")
		return errors.New("peer sent a binary message")
	}
	switch {
	case err == nil && env.IsStream():
		f := &StreamFrame{StreamID: env.StreamID, ID: env.ID, Phase: env.Phase, Frame: frame, Closing: contracts.IsStreamClosing(frame),
			RelayNodeID: env.RelayNodeRaw != nil}
		if c.opts.Streams == nil {
			c.RefuseStream(f, contracts.RelayStreamUnknown.Refuse("%s: this connection carries no streams", f.StreamID))
			return nil
		}
		c.opts.Streams.ServeStream(c, f)
	case err == nil && env.Phase == PhaseRequest:
		c.dispatch(env, nil)
	case err == nil:
		c.resolve(env)
	default:
		return c.malformed(err.(*DecodeError), len(frame))
	}
	return nil
}

// malformed handles a frame Decode refused. What names a request is answered by name, an answer
// completes its call as malformed, a stream frame without a correlation is dropped; only a frame
// that breaks the framing itself (no usable correlation on anything but a stream frame) ends the
// connection, and then the returned error says why.
func (c *Conn) malformed(de *DecodeError, size int) error {
	switch {
	case de.ID != "" && de.Phase == PhaseRequest:
		c.dispatch(Envelope{Method: de.Method, ID: de.ID}, contracts.RelayRequestInvalid.Refuse("%s", de.Reason))
	case de.ID != "":
		if p := c.take(de.ID); p != nil {
			p.timer.Stop()
			p.done(Reply{Err: fmt.Errorf("%w: %s", ErrMalformedAnswer, de.Reason)})
		}
	case de.Stream:
		c.dropped("stream-frame-malformed")
	default:
		c.opts.Logger.Warn().Int("bytes", size).Str("outcome", "malformed").Msg("closing: " + de.Reason)
		c.closeMisbehaving(websocket.StatusPolicyViolation, "malformed envelope")
		return de
	}
	return nil
}

func fieldOr(s, none string) string {
	if s == "" {
		return none
	}
	return s
}

func (c *Conn) dropped(reason string) {
	if c.opts.Dropped != nil {
		c.opts.Dropped(reason)
	}
}

// dispatch serves one request of the peer; refusal, when set, is its answer. Every request,
// refused or served, counts as in flight until its answer is written, so the inflight bound holds
// for all of them.
func (c *Conn) dispatch(env Envelope, refusal error) {
	r := &Request{Method: env.Method, Body: env.Request, RelayNodeRaw: env.RelayNodeRaw, conn: c, id: env.ID}
	switch n := c.inflight.Add(1); {
	case c.readsNothing(),
		n > int64(c.opts.MaxInflight) && c.sendq.answerBytes() > c.opts.MaxQueueBytes:
		// The peer has more unwritten frames than its share (or, uncharged, answers than the
		// queue may hold) and sends again: it sends and does not read. Closing is the only bound
		// left on what it can make us hold (docs/hostile.md).
		c.inflight.Add(-1) // this request is never answered: it ends with the connection
		c.opts.Logger.Warn().Str("outcome", "flooding").Msg("peer sends requests and reads no answers: closing")
		c.cancel(fmt.Errorf("%w: the peer reads no answers", ErrClosed))
		go c.closeMisbehaving(websocket.StatusPolicyViolation, "too many unanswered requests")
		return
	case n > int64(c.opts.MaxInflight):
		r.Fail(c.opts.BusyError)
		return
	case refusal != nil:
		r.Fail(refusal)
		return
	}
	if c.opts.Handler == nil {
		r.Fail(contracts.RelayMethodUnknown.Refuse("%s", env.Method))
		return
	}
	c.opts.Handler.ServeRequest(c, r)
}

// readsNothing reports whether a charged peer holds more frames queued to it than its share
// allows and does not read them: nothing written for a second, or four shares' worth queued.
// Only answers, which are never refused, can take it there.
func (c *Conn) readsNothing() bool {
	if c.opts.Share == nil {
		return false
	}
	queued, limit := int64(c.sendq.queuedBytes()), c.opts.Share.Limit()
	return queued > limit && (queued > 4*limit || c.Stalled(time.Second))
}

func (c *Conn) resolve(env Envelope) {
	c.mu.Lock()
	p := c.pending[env.ID]
	delete(c.pending, env.ID)
	c.mu.Unlock()
	if p == nil {
		c.opts.Logger.Debug().Str("method", env.Method).Str("outcome", "late").Msg("answer for no pending call")
		return
	}
	p.timer.Stop()
	rep := Reply{Response: env.Response, Retry: env.Retry}
	if env.Error != nil {
		rep = Reply{Err: env.Error, Retry: env.Retry}
	}
	p.done(rep)
}

func (c *Conn) sendLoop() error {
	ticker := time.NewTicker(c.opts.PingInterval)
	defer ticker.Stop()
	// One write may block at most DeadTimeout: a peer that drains nothing for that long is gone.
	stalled := time.AfterFunc(time.Hour, func() {
		c.cancel(fmt.Errorf("%w: a write blocked for %s", ErrClosed, c.opts.DeadTimeout))
	})
	stalled.Stop()
	defer stalled.Stop()
	var batch []frame
	for {
		select {
		case <-c.ctx.Done():
			return context.Cause(c.ctx)
		case <-c.sendq.wake:
			if c.opts.Cork != nil {
				runtime.Gosched() // let other senders on this multiplexed socket join the burst
			}
			// Writing from before the queue empties: drained, which looks at both, must never see
			// an empty queue and no write while frames are between the two (under load the
			// goroutine can be descheduled right there, and a judge's close then lost the answers).
			c.writing.Store(true)
			batch = c.sendq.take(batch[:0])
			if c.opts.afterTake != nil {
				c.opts.afterTake()
			}
			err := c.write(batch, stalled)
			c.wroteOne() // after write has cleared writing
			if err != nil {
				return err
			}
			clear(batch)
		case now := <-ticker.C:
			if silent := now.Sub(time.Unix(0, c.lastHeard.Load())); silent > c.opts.DeadTimeout {
				err := fmt.Errorf("%w: peer silent for %s", ErrClosed, silent.Round(time.Millisecond))
				c.cancel(err)   // the cause first: closing makes the read loop fail too
				c.ws.CloseNow() // no close handshake with a peer that answers nothing
				return err
			}
			if !c.pinging.Swap(true) {
				c.pingWG.Add(1)
				go c.ping()
			}
		}
	}
}

// write sends a batch of frames; with Options.Cork, a batch of several leaves in one write. A
// frame's charge is released, and an answer stops counting as in flight, once its bytes have left
// — or when the write fails and they never will. The caller has set writing; write clears it.
func (c *Conn) write(batch []frame, stalled *time.Timer) error {
	c.progress.Store(time.Now().UnixNano())
	defer c.writing.Store(false)
	defer c.progress.Store(0)
	defer stalled.Stop()
	sent := 0 // frames of batch released
	defer func() { c.settle(batch[sent:]) }()
	cork := c.opts.Cork
	if len(batch) < 2 {
		cork = nil
	}
	if cork != nil {
		cork.Cork()
	}
	for i := range batch {
		stalled.Reset(c.opts.DeadTimeout)
		if err := c.ws.Write(context.Background(), websocket.MessageText, batch[i].b); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		if cork == nil {
			c.settle(batch[i : i+1]) // marks progress
			sent++
		} else {
			c.progress.Store(time.Now().UnixNano()) // moving, even while corked bytes wait to leave
		}
	}
	if cork == nil {
		return nil
	}
	stalled.Reset(c.opts.DeadTimeout)
	if err := cork.Uncork(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// settle releases frames that were written or will never be.
func (c *Conn) settle(frames []frame) {
	if len(frames) > 0 && c.progress.Load() != 0 {
		c.progress.Store(time.Now().UnixNano())
	}
	for i := range frames {
		if frames[i].answer {
			c.inflight.Add(-1)
		}
		frames[i].done()
	}
}

func (c *Conn) ping() {
	defer c.pingWG.Done()
	defer c.pinging.Store(false)
	ctx, cancel := context.WithTimeout(c.ctx, c.opts.DeadTimeout)
	defer cancel()
	if c.ws.Ping(ctx) == nil {
		c.lastHeard.Store(time.Now().UnixNano())
	}
}

// shutdown fails every pending call with the close cause and refuses new ones.
func (c *Conn) shutdown() {
	c.mu.Lock()
	c.closed = true
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	c.inflight.Add(-int64(c.sendq.close()))
	err := fmt.Errorf("%w: %w", ErrClosed, context.Cause(c.ctx))
	if errors.Is(context.Cause(c.ctx), ErrClosed) {
		err = context.Cause(c.ctx)
	}
	for _, p := range pending {
		p.timer.Stop()
		p.done(Reply{Err: err})
	}
}

// RefuseStream answers a stream frame the receiver cannot route with err when the frame carries a
// correlation id in phase request, and reports true; any other frame cannot be answered (an
// answer to an answer could echo for ever) and is dropped, counted under the refusal's name.
func (c *Conn) RefuseStream(f *StreamFrame, err error) bool {
	if f.ID == "" || f.Phase != PhaseRequest {
		var r *contracts.Refusal
		reason := "stream-frame-unanswerable"
		if errors.As(err, &r) {
			reason = string(r.Name)
		}
		c.dropped(reason)
		return false
	}
	c.dispatch(Envelope{Method: contracts.MethodVirtualStream, ID: f.ID}, err)
	return true
}

// maxRefusal bounds the relay's own refusals, charged whatever the caps (budget Share.Refusal).
const maxRefusal = 1 << 10

// answer queues a response, charged before it is queued (docs/hostile.md) and never past a cap: an
// answer that does not fit its share is replaced by the refusal relay-node-busy, or waits for room
// when rep.Wait says so; only the relay's own small refusals are charged whatever the caps, since
// refusing a refusal would leave the request unanswered. Responses are never refused for queue
// space: the request stays in flight until its answer is written, so their number is bounded by
// MaxInflight.
func (c *Conn) answer(method, id string, rep Reply) {
	share := rep.Charge
	if share == nil {
		share = c.opts.Share
	}
	b := encodeAnswer(method, id, rep)
	if share != nil {
		switch {
		case isOwnRefusal(rep.Err) && len(b) <= maxRefusal:
			share.Refusal(len(b))
		case rep.Wait != nil:
			if !share.ChargeWait(len(b), rep.Wait, c.ctx.Done()) {
				c.inflight.Add(-1) // the peer or this connection ended: nobody is left to answer
				return
			}
		case !share.Charge(len(b)):
			c.dropped("answer-over-share")
			b = encodeAnswer(method, id, Reply{Err: contracts.RelayNodeBusy.Refuse("an answer of %d bytes does not fit the share of the relay's memory it is charged to", len(b))})
			share.Refusal(len(b))
		}
	}
	if c.sendq.push(frame{b: b, answer: true, charge: share}, false) != nil {
		c.inflight.Add(-1) // closed: the request ends unanswered with its connection
	}
}

func encodeAnswer(method, id string, rep Reply) []byte {
	env := Envelope{Method: method, ID: id, Phase: PhaseResponse, Response: rep.Response, Retry: rep.Retry}
	if rep.Err != nil {
		env.Error = ErrorFrom(rep.Err)
		env.Response = nil
	}
	return env.Append(make([]byte, 0, env.Size()))
}

// isOwnRefusal reports whether err is a refusal this side makes, not a peer's error passed on.
func isOwnRefusal(err error) bool {
	var remote *Error
	return err != nil && !errors.As(err, &remote)
}

// Request is one request from the peer. Answer it exactly once.
type Request struct {
	Method string
	Body   json.RawMessage
	// RelayNodeRaw is the envelope's relayNodeId member as the peer sent it, raw JSON; nil when it
	// sent none. The relay reads none from any peer and forwards none (Envelope.RelayNodeRaw). Like
	// Body it is a sub-slice of the frame: a handler that holds the request drops both.
	RelayNodeRaw json.RawMessage

	conn     *Conn
	id       string
	answered atomic.Bool
}

// Conn is the connection the request arrived on.
func (r *Request) Conn() *Conn { return r.conn }

// Answer sends the outcome. Later calls do nothing.
func (r *Request) Answer(rep Reply) {
	if r.answered.Swap(true) {
		return
	}
	r.conn.answer(r.Method, r.id, rep)
}

// Respond answers with a body.
func (r *Request) Respond(body json.RawMessage) { r.Answer(Reply{Response: body}) }

// Fail answers with an error (see ErrorFrom).
func (r *Request) Fail(err error) { r.Answer(Reply{Err: err}) }
