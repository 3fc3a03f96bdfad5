package ha

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"code.foss.global/serve.zone/relay/feature"
	"code.foss.global/serve.zone/relay/internal/backoff"
)

// The leader's side of the channel. A connection is admitted (at most maxChannels at once), runs
// the Noise handshake, and must then send { pod } as its first transport message: a replayed
// message 1 completes a handshake but cannot encrypt under the fresh keys the responder's
// ephemeral made, so a recorded handshake buys nothing beyond the handshake reply. The Pod must be
// another Pod of the release; a newer channel of the same Pod replaces the older. Only then does
// the leader take each part's whole state and feed it, then every change, from a queue charged to
// the relay's memory budget, writing with a deadline, pinging every keepalive, and dropping a
// standby heard from not at all for silence.

// slot is one admitted replication connection.
type slot struct {
	conn   net.Conn  // set at construction
	at     time.Time // set at construction: when it was accepted
	authed bool      // guarded by replication.mu: it said { pod } under the handshake
}

// serve accepts standbys until ctx ends, and feeds them while this relay leads. A failed Accept
// is retried after a backoff; only the listener's close ends it.
func (r *replication) serve(ctx context.Context) {
	ln := r.cfg.listener
	if ln == nil {
		return
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	bo := backoff.New()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			r.m.acceptErrors.Inc()
			wait := bo.Next()
			r.log.Warn().Err(err).Dur("wait", wait).Str("outcome", "failed").Msg("the replication listener failed to accept: trying again")
			select {
			case <-ctx.Done():
				return
			case <-r.cfg.clock.After(wait):
			}
			continue
		}
		bo.Reset()
		s, ok := r.admit(conn)
		if !ok {
			r.refused(conn, errChannelLimit)
			conn.Close()
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); r.serveOne(ctx, s) }()
	}
}

// admit takes a slot for conn: past maxChannels the oldest connection that has not said { pod }
// yet is closed to make room, and with none such conn is refused.
func (r *replication) admit(conn net.Conn) (*slot, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.slots) >= maxChannels {
		var oldest *slot
		for s := range r.slots {
			if !s.authed && (oldest == nil || s.at.Before(oldest.at)) {
				oldest = s
			}
		}
		if oldest == nil {
			return nil, false
		}
		delete(r.slots, oldest)
		oldest.conn.Close()
	}
	s := &slot{conn: conn, at: r.cfg.clock.Now()}
	r.slots[s] = struct{}{}
	return s, true
}

func (r *replication) refused(conn net.Conn, err error) {
	r.m.refused.WithLabelValues(reasonOf(err)).Inc()
	r.refusalLog.Warn().Str("remote", conn.RemoteAddr().String()).Str("outcome", reasonOf(err)).Msg("a replication peer was refused: " + err.Error())
}

// serveOne authenticates one connection and feeds it while this relay leads.
func (r *replication) serveOne(ctx context.Context, s *slot) {
	conn := s.conn
	defer func() {
		conn.Close()
		r.mu.Lock()
		delete(r.slots, s)
		r.mu.Unlock()
	}()
	pod, ch, err := r.authenticate(ctx, conn)
	if err != nil {
		r.refused(conn, err)
		return
	}
	r.mu.Lock()
	_, open := r.slots[s]
	s.authed = open
	r.mu.Unlock()
	if !open {
		return // closed to make room while it authenticated
	}
	r.feed(ctx, pod, conn, ch)
}

// authenticate runs the handshake and reads { pod }, within handshakeTimeout, and judges the Pod.
// Nothing is sent but the handshake's reply.
func (r *replication) authenticate(ctx context.Context, conn net.Conn) (string, *channel, error) {
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	ch, err := handshake(conn, r.cfg.key, false)
	if err != nil {
		return "", nil, errHandshake
	}
	ch.writeTimeout = r.cfg.writeTimeout
	b, err := ch.readFrame(maxPeerFrame)
	if err != nil {
		return "", nil, errHello
	}
	pod, err := readHello(b)
	if err != nil {
		return "", nil, err
	}
	for _, self := range r.cfg.self {
		if pod == self {
			return "", nil, errPodRefused
		}
	}
	if !r.p.leading() {
		return "", nil, errNotLeading
	}
	if r.p.checkPod != nil {
		actx, cancel := context.WithTimeout(ctx, apiTimeout)
		err := r.p.checkPod(actx, pod)
		cancel()
		if err != nil {
			r.log.Debug().Err(err).Str("pod", pod).Msg("a replication peer's Pod was not found as one of this release")
			return "", nil, errPodRefused
		}
	}
	conn.SetDeadline(time.Time{})
	return pod, ch, nil
}

// feed copies every part to the standby pod on ch until the channel ends, then reports why.
func (r *replication) feed(ctx context.Context, pod string, conn net.Conn, ch *channel) {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	f := &feed{r: r, pod: pod, ch: ch, since: r.cfg.clock.Now().UTC().Truncate(time.Millisecond), cancel: cancel,
		wake: make(chan struct{}, 1)}
	if m, ok := r.memory.Load().(feature.Memory); ok {
		f.share = m.NewShare(standbyShare)
		defer f.share.Close()
	}
	f.heard.Store(r.cfg.clock.Now().UnixNano())
	stop := context.AfterFunc(fctx, func() { conn.Close() })
	defer stop()
	// The whole state, then every change: each part's records are pushed under its lock, so a
	// change made after Replicate returned is queued after the state it changes.
	var stops []func()
	for _, p := range r.cfg.parts {
		stops = append(stops, p.Part.Replicate(func(key string, value []byte) {
			if !strings.HasPrefix(key, p.Prefix) {
				return // not the part's: never sent
			}
			r.countRun(key, value)
			f.push(record{key: key, value: value})
		}))
	}
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	f.push(record{synced: true})
	r.register(f)
	r.log.Info().Str("pod", pod).Str("remote", conn.RemoteAddr().String()).Int("runs", r.runsFed()).Str("outcome", "connected").Msg("feeding a standby")

	// One writer and one reader; the first to end ends the channel (closing conn ends the other).
	ends := make(chan error, 2)
	go func() { ends <- f.write(fctx) }()
	go func() { ends <- f.read() }()
	err := <-ends
	if cause := context.Cause(fctx); cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause // ended from outside: replaced, missed an ack, stepped down, queue full
	}
	f.end(err)
	<-ends
	r.unregister(f, err)
}

// register makes f the channel of its Pod, replacing an older one.
func (r *replication) register(f *feed) {
	r.mu.Lock()
	old := r.byPod[f.pod]
	r.byPod[f.pod] = f
	r.m.standbys.Set(float64(len(r.byPod)))
	r.mu.Unlock()
	if old != nil {
		old.end(errReplaced)
	}
}

// unregister reports f's end: logged, counted by reason, noted for the status page.
func (r *replication) unregister(f *feed, err error) {
	reason := reasonOf(err)
	r.mu.Lock()
	if r.byPod[f.pod] == f {
		delete(r.byPod, f.pod)
	}
	r.m.standbys.Set(float64(len(r.byPod)))
	r.lastDropped = &EventStatus{At: r.cfg.clock.Now().UTC().Truncate(time.Millisecond), Reason: reason, Pod: f.pod}
	r.mu.Unlock()
	r.m.dropped.WithLabelValues(reason).Inc()
	ev := r.log.Info()
	if reason != "closed" && reason != "replaced" && reason != "stepped-down" {
		ev = r.log.Warn()
	}
	ev.Str("pod", f.pod).Str("outcome", reason).Msg("a standby is no longer fed")
}

// feed is one standby's queue on the leader: pushed to under the replicated parts' locks, never
// blocking; written by write, acknowledged through read.
type feed struct {
	r      *replication            // set at construction
	pod    string                  // set at construction
	ch     *channel                // set at construction: written by write, read by read
	since  time.Time               // set at construction
	share  feature.Share           // set at construction: the queue's bytes in the memory budget; nil: none
	cancel context.CancelCauseFunc // set at construction: ends the channel
	wake   chan struct{}           // a push happened
	heard  atomic.Int64            // the clock's Unix nanos of the standby's last frame

	mu       sync.Mutex
	items    []record // guarded by mu: queued, not yet taken by write
	queued   int64    // guarded by mu: their cost, when there is no share
	pushed   uint64   // guarded by mu: records pushed; the last one's number
	acked    uint64   // guarded by mu: records the standby acknowledged
	syncedAt uint64   // guarded by mu: the synced marker's number (0: not pushed yet)
	closed   bool     // guarded by mu
	waiters  []waiter // guarded by mu: Sync calls waiting for an acknowledgement
}

type waiter struct {
	upto uint64
	w    *syncWait
}

func cost(rc record) int { return len(rc.key) + len(rc.value) + recordCost }

// push queues a record. It runs under a part's lock: it never blocks, and a queue past its share
// ends the channel from elsewhere.
func (f *feed) push(rc record) {
	n := cost(rc)
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	fits := false
	if f.share != nil {
		fits = f.share.Charge(n)
	} else if f.queued+int64(n) <= standbyShare {
		f.queued += int64(n)
		fits = true
	}
	if !fits {
		f.mu.Unlock()
		go f.end(errQueueFull)
		return
	}
	f.items = append(f.items, rc)
	f.pushed++
	if rc.synced {
		f.syncedAt = f.pushed
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *feed) releaseLocked(n int) {
	if f.share != nil {
		f.share.Release(n)
	} else {
		f.queued -= int64(n)
	}
}

func (f *feed) take() []record {
	f.mu.Lock()
	defer f.mu.Unlock()
	items := f.items
	f.items = nil
	return items
}

// isReady: the standby has acknowledged the whole state; holds wait for it from now on.
func (f *feed) isReady() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.closed && f.syncedAt > 0 && f.acked >= f.syncedAt
}

// Outcomes of await.
const (
	awaitDone    = iota // acknowledged already
	awaitPending        // waiting
	awaitGone           // the channel has ended
)

// await makes w wait for the standby's acknowledgement of everything pushed so far.
func (f *feed) await(w *syncWait) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.closed:
		return awaitGone
	case f.acked >= f.pushed:
		return awaitDone
	}
	f.waiters = append(f.waiters, waiter{upto: f.pushed, w: w})
	return awaitPending
}

// ack records the standby's acknowledgement of records 1…n.
func (f *feed) ack(n uint64) error {
	f.mu.Lock()
	if n > f.pushed {
		f.mu.Unlock()
		return errAckBad
	}
	var done []*syncWait
	if n > f.acked {
		f.acked = n
		kept := f.waiters[:0]
		for _, w := range f.waiters {
			if w.upto <= n {
				done = append(done, w.w)
			} else {
				kept = append(kept, w)
			}
		}
		clear(f.waiters[len(kept):])
		f.waiters = kept
	}
	f.mu.Unlock()
	for _, w := range done {
		w.resolved(f, false)
	}
	return nil
}

// end closes the channel with err as its cause: what is queued is dropped (its charges given
// back), and every Sync waiting for it hears that it is gone. It is safe from any goroutine, once
// or many times.
func (f *feed) end(err error) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	for _, rc := range f.items {
		f.releaseLocked(cost(rc))
	}
	f.items = nil
	waiters := f.waiters
	f.waiters = nil
	f.mu.Unlock()
	f.cancel(err)
	for _, w := range waiters {
		w.w.resolved(f, true)
	}
}

// write sends what is queued, a ping every keepalive, and ends the channel when the standby has
// been silent for silence or this relay no longer leads.
func (f *feed) write(ctx context.Context) error {
	clk := f.r.cfg.clock
	tick := clk.NewTicker(keepalive)
	defer tick.Stop()
	for {
		items := f.take()
		for i, rc := range items {
			err := f.ch.writeFrame(rc.frame())
			f.mu.Lock()
			f.releaseLocked(cost(rc))
			if err != nil {
				for _, rest := range items[i+1:] {
					f.releaseLocked(cost(rest))
				}
			}
			f.mu.Unlock()
			if err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.wake:
		case <-tick.C():
			if !f.r.p.leading() {
				return errStepDown
			}
			if clk.Since(time.Unix(0, f.heard.Load())) > silence {
				return errSilent
			}
			if err := f.ch.writeFrame(pingFrame); err != nil {
				return err
			}
		}
	}
}

// read takes the standby's acknowledgements, which are its keepalive too.
func (f *feed) read() error {
	for {
		b, err := f.ch.readFrame(maxPeerFrame)
		if err != nil {
			return err
		}
		n, err := readAck(b)
		if err != nil {
			return errAckBad
		}
		f.heard.Store(f.r.cfg.clock.Now().UnixNano())
		if err := f.ack(n); err != nil {
			return err
		}
	}
}
