package platform

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/feature"
)

// Backups, node → Cloudly: a closure read from the node's Corestore is written into a
// VirtualStream the relay opens, carried by backupServiceDatabaseClosure, chunk by chunk as the
// library writes one: each chunk waits for Cloudly's answer (and, while it says backpressure,
// for Cloudly to ask for more), a keep-alive goes every second, the closing chunk ends it. So at
// most one chunk of a closure is in flight: what it holds is one read buffer and two frames,
// charged to its share, whatever the closure's size.

// keepAliveEvery is the library's keep-alive cadence; feedbackEvery how often a writer asks
// again while the reader says backpressure (the library's 50 ms).
const (
	keepAliveEvery = time.Second
	feedbackEvery  = 50 * time.Millisecond
)

// closureShare is what one closure may hold at once: its read buffer and two frames.
func (p *Platform) closureShare() int64 {
	return int64(p.opts.ChunkBytes + 2*contracts.MaxBufferChunkLen(p.opts.ChunkBytes) + 4096)
}

// backup carries one ready backup to Cloudly and, when Cloudly accepts it, tells Corestore.
func (n *node) backup(origin string, cred contracts.Secret, b contracts.CorestoreBackup) {
	start := time.Now()
	sent, err := n.sendBackup(origin, cred, b)
	n.carried(carriedBackup, b.BackupID, sent, err, start)
}

// carriage is what a carried closure is counted, kept and logged as: a backup or a restore.
type carriage struct {
	ok     string                                  // the outcome when it went whole
	metric func(*metrics) *prometheus.CounterVec   // its outcome counter
	count  func(*node) (last *string, done *int64) // guarded by the node's mu: its status fields
	msg    string
}

var (
	carriedBackup = carriage{outcomeDelivered, func(m *metrics) *prometheus.CounterVec { return m.backups },
		func(n *node) (*string, *int64) { return &n.lastBackup, &n.delivered }, "database backup carried to Cloudly"}
	carriedRestore = carriage{outcomeSettled, func(m *metrics) *prometheus.CounterVec { return m.restores },
		func(n *node) (*string, *int64) { return &n.lastRestor, &n.settled }, "database restore carried to Corestore"}
)

// carried counts, keeps on the node's status and logs one closure carried (or not) with c.
func (n *node) carried(c carriage, backupID string, bytes int64, err error, start time.Time) {
	p := n.p
	out := outcome(err, c.ok)
	c.metric(p.metrics).WithLabelValues(out).Inc()
	n.mu.Lock()
	last, done := c.count(n)
	*last = out
	if err == nil {
		*done++
	}
	n.mu.Unlock()
	ev := p.log.Debug()
	if err != nil {
		ev = p.log.Info()
	}
	ev.Str("node", n.id).Str("backup", backupID).Int64("bytes", bytes).Str("outcome", out).Dur("latency", time.Since(start)).Msg(c.msg)
}

// closureSlot takes one of the slots the node's closures are carried in (slots.go), on an
// upstream that carries streams of its own; release gives it back.
func (n *node) closureSlot() (release func(), err error) {
	p := n.p
	if p.streams == nil || p.memory == nil {
		return nil, contracts.RelayMethodUnknown.Refuse("this relay's upstream carries no streams of its own")
	}
	if !p.slots.acquire(n.ctx, n.id) {
		return nil, errStopped
	}
	return func() { p.slots.release(n.id) }, nil
}

// errNotAccepted is Cloudly's { accepted: false }: the backup stays ready and is offered again.
var errNotAccepted = errors.New("Cloudly did not accept the backup")

func (n *node) sendBackup(origin string, cred contracts.Secret, b contracts.CorestoreBackup) (int64, error) {
	p := n.p
	release, err := n.closureSlot()
	if err != nil {
		return 0, err
	}
	defer release()
	body, err := p.cs.OpenBackupClosure(n.ctx, origin, cred, b.BackupID)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	share := p.memory.NewShare(p.closureShare())
	defer share.Close()
	if !share.Charge(p.opts.ChunkBytes) { // the read buffer
		return 0, contracts.RelayNodeBusy.Refuse("the relay's peer memory budget has no room for a closure")
	}
	defer share.Release(p.opts.ChunkBytes)
	w := &writer{n: n, answers: make(chan contracts.StreamFrameBody, 64)}
	st, err := p.streams.OpenStream(share, w)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	w.st = st
	answered := make(chan callResult, 1)
	req := contracts.BackupClosureRequest{BackupID: b.BackupID, ServiceID: b.ServiceID, NodeID: n.id, Descriptor: b.Descriptor, StreamID: st.ID()}
	st.Call(contracts.MethodBackupServiceDatabaseClosure, req.Encode(), func(body json.RawMessage, err error) { answered <- callResult{body, err} })
	sent, werr := w.write(body, make([]byte, p.opts.ChunkBytes), answered)
	if werr != nil && !errors.Is(werr, errAnsweredEarly) {
		w.abort()
		return sent, werr
	}
	res, ok := w.early, w.early != nil
	if !ok {
		select {
		case r := <-answered:
			res = &r
		case <-n.ctx.Done():
			return sent, errStopped
		}
	}
	if res.err != nil {
		return sent, res.err
	}
	accepted, err := contracts.ReadBackupClosureResponse(res.body)
	switch {
	case err != nil:
		return sent, contracts.RelayRequestInvalid.Refuse("Cloudly's answer to %s: %v", contracts.MethodBackupServiceDatabaseClosure, err)
	case !accepted:
		return sent, errNotAccepted
	case werr != nil:
		// Accepted before the closing chunk: Cloudly cannot hold the whole closure, so it is not
		// a delivery.
		return sent, contracts.RelayRequestInvalid.Refuse("Cloudly accepted the backup before its closure ended")
	}
	ctx, cancel := context.WithTimeout(n.ctx, p.opts.CallTimeout)
	defer cancel()
	return sent, p.cs.MarkDelivered(ctx, origin, cred, b.BackupID)
}

type callResult struct {
	body []byte
	err  error
}

// errAnsweredEarly: Cloudly answered the call before the closure ended.
var errAnsweredEarly = errors.New("Cloudly answered before the closure ended")

// errStopped: the node left the configuration, or the agent closed.
var errStopped = contracts.RestoreNodeUnreachable.Refuse("the platform agent stopped this node's work")

// writer is the relay's end of a backup's stream: Cloudly's frames for it are answers to the
// chunks, feedback requests and keep-alives the relay sends.
type writer struct {
	n       *node
	st      feature.Stream
	answers chan contracts.StreamFrameBody // Cloudly's frames, read; full: dropped
	cycles  int                            // owned by write: cycle ids sent
	early   *callResult                    // owned by write: the call's answer, when it came while writing
}

// StreamFrame takes one of Cloudly's frames on the socket's read loop: read (an answer is small)
// and queued for write, never blocking.
func (w *writer) StreamFrame(frame []byte) {
	f, err := contracts.ReadStreamFrameBody(frame)
	if err != nil {
		w.n.p.metrics.frames.WithLabelValues("unreadable").Inc()
		return
	}
	select {
	case w.answers <- f:
	default:
		w.n.p.metrics.frames.WithLabelValues("dropped").Inc()
	}
}

func (w *writer) cycle() string {
	w.cycles++
	return w.st.ID() + "-" + strconv.Itoa(w.cycles)
}

// write streams body to its end, then the closing chunk, each chunk answered before the next;
// it returns the closure bytes read. While Cloudly reads one chunk, the next is read from
// Corestore and encoded (one raw buffer, two frames), so the relay's own work overlaps the
// wire's round trip without a second chunk in flight. errAnsweredEarly means Cloudly answered the
// call first.
func (w *writer) write(body io.Reader, buf []byte, answered <-chan callResult) (int64, error) {
	type chunk struct {
		frame   []byte
		cycle   string
		n       int
		closing bool
	}
	var frames [2][]byte
	var read int64
	eof := false
	next := func(k int) (chunk, error) {
		c := w.cycle()
		if !eof {
			m, rerr := io.ReadFull(body, buf)
			eof = rerr == io.EOF || rerr == io.ErrUnexpectedEOF
			if rerr != nil && !eof {
				return chunk{}, rerr
			}
			if read += int64(m); read > contracts.MaxCorestoreClosureBytes {
				return chunk{}, contracts.RelayRequestInvalid.Refuse("the closure is over the Corestore closure limit of %d bytes", contracts.MaxCorestoreClosureBytes)
			}
			if m > 0 {
				frames[k%2] = contracts.AppendChunkFrame(frames[k%2][:0], w.st.ID(), c, buf[:m], true, false)
				return chunk{frame: frames[k%2], cycle: c, n: m}, nil
			}
		}
		frames[k%2] = contracts.AppendChunkFrame(frames[k%2][:0], w.st.ID(), c, nil, false, true)
		return chunk{frame: frames[k%2], cycle: c, closing: true}, nil
	}
	ka := time.NewTicker(keepAliveEvery)
	defer ka.Stop()
	cur, err := next(0)
	for k := 0; ; k++ {
		if err != nil {
			return read, err
		}
		if err := w.st.Send(cur.frame); err != nil {
			return read, err
		}
		var ahead chunk
		var aheadErr error
		if !cur.closing {
			ahead, aheadErr = next(k + 1) // while Cloudly reads cur
		}
		if err := w.await(cur.cycle, cur.closing, ka, answered); err != nil {
			return read, err
		}
		w.n.p.metrics.bytes.WithLabelValues("to-cloudly").Add(float64(cur.n))
		if cur.closing {
			return read, nil
		}
		cur, err = ahead, aheadErr
	}
}

// await waits for the answer to the frame sent under cycle, asking again while Cloudly says
// backpressure and keeping the stream alive meanwhile. The call's own answer ends the wait too:
// for the closing chunk, that is the end of the closure; before it, Cloudly gave up early.
func (w *writer) await(cycle string, closing bool, ka *time.Ticker, answered <-chan callResult) error {
	idle := time.NewTimer(w.n.p.opts.StreamIdle)
	defer idle.Stop()
	var again <-chan time.Time
	for {
		select {
		case f := <-w.answers:
			switch {
			case f.ErrorText != "":
				return contracts.RelayRequestInvalid.Refuse("Cloudly refused the closure's stream")
			case !f.Response.Present:
				// A request of Cloudly's own: answered. A frame with a response is an answer,
				// whatever its request member says (the library echoes the request in its
				// answers): answering it would bounce it between the two ends for ever.
				if f.Request.Present {
					w.answerRequest(f)
				}
			case f.Response.MainPurpose == "keepAlive" && f.Response.HasKeepAlive && !f.Response.KeepAlive:
				return contracts.RelayUpstreamDetached.Refuse("Cloudly ended the closure's stream")
			case f.Response.CycleID != cycle:
			case f.Response.Backpressure:
				t := time.NewTimer(feedbackEvery)
				again = t.C
			default:
				return nil
			}
		case <-again:
			again = nil
			cycle = w.cycle()
			if err := w.st.Send(contracts.AppendFeedbackFrame(nil, w.st.ID(), cycle)); err != nil {
				return err
			}
		case <-ka.C:
			if err := w.st.Send(contracts.AppendKeepAliveFrame(nil, w.st.ID(), w.cycle(), true)); err != nil {
				return err
			}
		case <-idle.C:
			return contracts.RelayClosureStalled.Refuse("Cloudly did not answer a closure chunk within %s", w.n.p.opts.StreamIdle)
		case r := <-answered:
			w.early = &r
			if closing {
				return nil
			}
			return errAnsweredEarly
		case <-w.st.Done():
			return contracts.RelayUpstreamDetached.Refuse("the Cloudly session was lost during the closure")
		case <-w.n.ctx.Done():
			return errStopped
		}
	}
}

// answerRequest answers a request Cloudly sent on the stream (a keep-alive of its own, say).
func (w *writer) answerRequest(f contracts.StreamFrameBody) {
	purpose := "feedback"
	if f.Request.MainPurpose == "keepAlive" {
		purpose = "keepAlive"
	}
	w.st.Send(contracts.AppendStreamAnswer(nil, contracts.StreamAnswer{StreamID: w.st.ID(), CycleID: f.Request.CycleID,
		Purpose: purpose, Request: f.RequestRaw, KeepAlive: true}))
}

// abort ends the stream without its closing chunk, as the library ends one: keepAlive false.
func (w *writer) abort() {
	w.st.Send(contracts.AppendKeepAliveFrame(nil, w.st.ID(), w.cycle(), false))
}
