package typedsocket

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// The call path: every request the connection sends, blocking or not, and every frame it
// forwards, goes through here.

// call is a request in flight, in Conn.pending until its outcome is taken.
type call struct {
	done  func(Reply)
	timer *time.Timer
}

// A CallOption adjusts one request sent by CallAsync or Call, or one frame sent by SendFrame.
// Without any, a request is charged to Options.Share, states no relayNodeId and waits
// Options.CallTimeout for its answer.
type CallOption func(*callConfig)

type callConfig struct {
	share   Share         // charged for the bytes until written; nil: nothing
	node    string        // stated in the envelope's relayNodeId; "": none
	timeout time.Duration // the wait for the answer; 0: Options.CallTimeout
	observe func(Reply)   // handed the outcome first; nil: nobody
}

// Charge charges the bytes to share until written instead of Options.Share: the downstream peer a
// request or frame is sent on behalf of. nil charges nothing. A charge that does not fit is
// ErrOverShare.
func Charge(share Share) CallOption { return func(o *callConfig) { o.share = share } }

// ForNode states node in the request's envelope relayNodeId ("" states none): a node's request
// the relay forwards to Cloudly. A frame sent by SendFrame is untouched by it.
func ForNode(node string) CallOption { return func(o *callConfig) { o.node = node } }

// Timeout bounds the wait for the answer (0: Options.CallTimeout); for Call it replaces ctx's
// deadline as the call's timeout. A frame has no answer to wait for.
func Timeout(d time.Duration) CallOption { return func(o *callConfig) { o.timeout = d } }

// Observe hands the outcome to f on the read loop before it is delivered, before the peer's next
// message is read: what the answer changes is recorded before the peer's next request is served.
// f must not block. A frame has no outcome to observe.
func Observe(f func(Reply)) CallOption { return func(o *callConfig) { o.observe = f } }

// configure applies opts over the connection's defaults; timeout is the one before them.
func (c *Conn) configure(timeout time.Duration, opts []CallOption) callConfig {
	cfg := callConfig{share: c.opts.Share, timeout: timeout}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// CallAsync sends a request and calls done exactly once with its outcome: from the read loop when
// the answer arrives (done must not block), or from a timer after the timeout. It returns the
// call in flight (zero when done has been called already). An error means the request was not
// sent and done will not be called: ErrClosed, ErrOverShare when the charge does not fit, or
// ErrQueueFull when the peer is not draining its queue. Every request on the connection is sent
// here.
func (c *Conn) CallAsync(method string, body json.RawMessage, done func(Reply), opts ...CallOption) (Pending, error) {
	return c.send(method, body, done, c.configure(0, opts))
}

// send is the one path every request takes.
func (c *Conn) send(method string, body json.RawMessage, done func(Reply), cfg callConfig) (Pending, error) {
	if observe := cfg.observe; observe != nil {
		deliver := done
		done = func(r Reply) { observe(r); deliver(r) }
	}
	share, timeout := cfg.share, cfg.timeout
	env := Envelope{Method: method, Phase: PhaseRequest, Request: body, RelayNodeID: cfg.node}
	size := env.Size() + MaxIDLen
	if share != nil && !share.Charge(size) {
		return Pending{}, ErrOverShare
	}
	if timeout <= 0 {
		timeout = c.opts.CallTimeout
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		if share != nil {
			share.Release(size)
		}
		return Pending{}, ErrClosed
	}
	c.nextID++
	id := formatID(c.nextID)
	p := &call{done: done}
	c.pending[id] = p
	// The timer is armed under mu so that resolve, which takes the call under mu, always sees it.
	p.timer = time.AfterFunc(timeout, func() {
		if c.take(id) != nil {
			done(Reply{Err: fmt.Errorf("%w (%s after %s)", ErrTimeout, method, timeout)})
		}
	})
	c.mu.Unlock()

	env.ID = id
	b := env.Append(make([]byte, 0, size))
	if share != nil && len(b) != size {
		share.Release(size - len(b)) // the charge is the frame's exact size from here on
	}
	if err := c.sendq.push(frame{b: b, charge: share}, true); err != nil {
		if c.take(id) == nil {
			// A shutdown or the timer took the call first and calls done: reporting the error
			// too would complete it twice.
			return Pending{}, nil
		}
		p.timer.Stop()
		return Pending{}, err
	}
	return Pending{c: c, id: id, timeout: timeout}, nil
}

// Pending is a call in flight, as CallAsync returns it.
type Pending struct {
	c       *Conn
	id      string
	timeout time.Duration
}

// Extend gives the call another whole timeout from now, while it is still pending: a request
// whose answer waits on a stream it carries is alive as long as the stream moves.
func (k Pending) Extend() {
	if k.c == nil {
		return
	}
	k.c.mu.Lock()
	if p := k.c.pending[k.id]; p != nil {
		p.timer.Reset(k.timeout)
	}
	k.c.mu.Unlock()
}

func (c *Conn) take(id string) *call {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pending[id]
	delete(c.pending, id)
	return p
}

// Call is CallAsync that waits for the outcome, or for ctx to end. ctx's deadline, when it has
// one, is the call's timeout unless a Timeout option says otherwise.
func (c *Conn) Call(ctx context.Context, method string, body json.RawMessage, opts ...CallOption) (json.RawMessage, error) {
	var timeout time.Duration
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	ch := make(chan Reply, 1)
	if _, err := c.send(method, body, func(r Reply) { ch <- r }, c.configure(timeout, opts)); err != nil {
		return nil, err
	}
	select {
	case r := <-ch:
		return r.Response, r.Err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// SendFrame queues a frame already encoded, untouched: a stream frame forwarded whole, charged to
// the connection's share (or Charge's) until written; the other options do not apply to a frame.
// Like a call, it is refused at once when the share (ErrOverShare) or the queue (ErrQueueFull) is
// full or the connection is closed.
func (c *Conn) SendFrame(b []byte, opts ...CallOption) error {
	share := c.configure(0, opts).share
	if share != nil && !share.Charge(len(b)) {
		return ErrOverShare
	}
	return c.sendq.push(frame{b: b, charge: share}, true)
}
