package vstream

import (
	"io"
	"strconv"
	"time"

	"k8s.io/utils/clock"

	"code.foss.global/serve.zone/relay/contracts"
)

// WriterOptions shape a Writer; zero values mean the defaults.
type WriterOptions struct {
	Clock          clock.WithTicker // nil: the wall clock
	ChunkBytes     int              // bytes per chunk; 256 KiB
	Limit          int64            // more bytes than this fail relay-request-invalid; 0: no limit
	KeepAliveEvery time.Duration
	FeedbackEvery  time.Duration
	Idle           time.Duration // no answer to a chunk this long: relay-closure-stalled
	// Stop, when closed, ends Write with Stopped (ErrStopped when nil).
	Stop    <-chan struct{}
	Stopped error
	// Ended, when closed, ends the wait: after the closing chunk was sent it ends the stream
	// (the call it belongs to was answered), before it Write fails with ErrEndedEarly.
	Ended <-chan struct{}
	// Answered hears the bytes of each chunk the reader answered.
	Answered func(n int)
	// Dropped hears a frame of the reader's the writer did not take: "unreadable" or "dropped".
	Dropped func(reason string)
	// Peer names the other end in refusal reasons ("the peer" when empty).
	Peer string
}

// Writer is the writing end of one stream. Its StreamFrame takes the reader's frames (answers,
// and requests of its own) from the link's read loop; Write runs on its own goroutine.
type Writer struct {
	opts    WriterOptions
	clock   clock.WithTicker
	answers chan contracts.StreamFrameBody // the reader's frames, read; full: dropped
	link    Link                           // owned by Write
	cycles  int                            // owned by Write: cycle ids sent
}

// NewWriter returns a writer; its frames go out on the link Write is given.
func NewWriter(opts WriterOptions) *Writer {
	if opts.ChunkBytes <= 0 {
		opts.ChunkBytes = 256 << 10
	}
	if opts.KeepAliveEvery <= 0 {
		opts.KeepAliveEvery = DefaultKeepAliveEvery
	}
	if opts.FeedbackEvery <= 0 {
		opts.FeedbackEvery = DefaultFeedbackEvery
	}
	if opts.Idle <= 0 {
		opts.Idle = DefaultIdle
	}
	if opts.Peer == "" {
		opts.Peer = "the peer"
	}
	if opts.Stopped == nil {
		opts.Stopped = ErrStopped
	}
	return &Writer{opts: opts, clock: orReal(opts.Clock), answers: make(chan contracts.StreamFrameBody, 64)}
}

// SetAnswered sets Answered (before Write).
func (w *Writer) SetAnswered(f func(n int)) { w.opts.Answered = f }

// StreamFrame takes one of the reader's frames: read (an answer is small) and queued for Write,
// never blocking.
func (w *Writer) StreamFrame(frame []byte) {
	f, err := contracts.ReadStreamFrameBody(frame)
	if err != nil {
		w.dropped("unreadable")
		return
	}
	select {
	case w.answers <- f:
	default:
		w.dropped("dropped")
	}
}

func (w *Writer) dropped(reason string) {
	if w.opts.Dropped != nil {
		w.opts.Dropped(reason)
	}
}

func (w *Writer) cycle() string {
	w.cycles++
	return w.link.ID() + "-" + strconv.Itoa(w.cycles)
}

// Write streams body to its end on link, then the closing chunk, each chunk answered before the
// next; it returns the bytes read from body. While the reader takes one chunk, the next is read
// from body and encoded (one read buffer, two frames), so the writer's own work overlaps the
// round trip without a second chunk in flight.
func (w *Writer) Write(link Link, body io.Reader) (int64, error) {
	w.link = link
	type chunk struct {
		frame   []byte
		cycle   string
		n       int
		closing bool
	}
	buf := make([]byte, w.opts.ChunkBytes)
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
			if read += int64(m); w.opts.Limit > 0 && read > w.opts.Limit {
				return chunk{}, contracts.RelayRequestInvalid.Refuse("the stream is over its limit of %d bytes", w.opts.Limit)
			}
			if m > 0 {
				frames[k%2] = contracts.AppendChunkFrame(frames[k%2][:0], link.ID(), c, buf[:m], true, false)
				return chunk{frame: frames[k%2], cycle: c, n: m}, nil
			}
		}
		frames[k%2] = contracts.AppendChunkFrame(frames[k%2][:0], link.ID(), c, nil, false, true)
		return chunk{frame: frames[k%2], cycle: c, closing: true}, nil
	}
	ka := w.clock.NewTicker(w.opts.KeepAliveEvery)
	defer ka.Stop()
	cur, err := next(0)
	for k := 0; ; k++ {
		if err != nil {
			return read, err
		}
		if err := link.Send(cur.frame); err != nil {
			return read, err
		}
		var ahead chunk
		var aheadErr error
		if !cur.closing {
			ahead, aheadErr = next(k + 1) // while the reader takes cur
		}
		if err := w.await(cur.cycle, cur.closing, ka.C()); err != nil {
			return read, err
		}
		if w.opts.Answered != nil && cur.n > 0 {
			w.opts.Answered(cur.n)
		}
		if cur.closing {
			return read, nil
		}
		cur, err = ahead, aheadErr
	}
}

// await waits for the answer to the frame sent under cycle, asking again while the reader says
// backpressure and keeping the stream alive meanwhile.
func (w *Writer) await(cycle string, closing bool, ka <-chan time.Time) error {
	idle := w.clock.NewTimer(w.opts.Idle)
	defer idle.Stop()
	var againT clock.Timer
	defer func() {
		if againT != nil {
			againT.Stop()
		}
	}()
	var again <-chan time.Time
	for {
		select {
		case f := <-w.answers:
			switch {
			case f.ErrorText != "":
				return &PeerRefusal{Text: f.ErrorText, ref: contracts.RelayRequestInvalid.Refuse("%s refused the stream", w.opts.Peer)}
			case !f.Response.Present:
				// A request of the reader's own: answered. A frame with a response is an answer,
				// whatever its request member says (the library echoes the request in its
				// answers): answering it would bounce it between the two ends for ever.
				if f.Request.Present {
					w.answerRequest(f)
				}
			case f.Response.MainPurpose == "keepAlive" && f.Response.HasKeepAlive && !f.Response.KeepAlive:
				return contracts.RelayUpstreamDetached.Refuse("%s ended the stream", w.opts.Peer)
			case f.Response.CycleID != cycle:
			case f.Response.Backpressure:
				if againT == nil {
					againT = w.clock.NewTimer(w.opts.FeedbackEvery)
				} else {
					againT.Reset(w.opts.FeedbackEvery)
				}
				again = againT.C()
			default:
				return nil
			}
		case <-again:
			again = nil
			cycle = w.cycle()
			if err := w.link.Send(contracts.AppendFeedbackFrame(nil, w.link.ID(), cycle)); err != nil {
				return err
			}
		case <-ka:
			if err := w.link.Send(contracts.AppendKeepAliveFrame(nil, w.link.ID(), w.cycle(), true)); err != nil {
				return err
			}
		case <-idle.C():
			return contracts.RelayClosureStalled.Refuse("%s did not answer a chunk within %s", w.opts.Peer, w.opts.Idle)
		case <-w.opts.Ended:
			if closing {
				return nil
			}
			return ErrEndedEarly
		case <-w.link.Done():
			return contracts.RelayUpstreamDetached.Refuse("the link to %s was lost during the stream", w.opts.Peer)
		case <-w.opts.Stop:
			return w.opts.Stopped
		}
	}
}

// answerRequest answers a request the reader sent on the stream (a keep-alive of its own, say).
func (w *Writer) answerRequest(f contracts.StreamFrameBody) {
	purpose := "feedback"
	if f.Request.MainPurpose == "keepAlive" {
		purpose = "keepAlive"
	}
	w.link.Send(contracts.AppendStreamAnswer(nil, contracts.StreamAnswer{StreamID: w.link.ID(), CycleID: f.Request.CycleID,
		Purpose: purpose, Request: f.RequestRaw, KeepAlive: true}))
}

// Abort ends the stream on link without its closing chunk, as the library ends one: keepAlive
// false.
func (w *Writer) Abort(link Link) {
	w.cycles++
	link.Send(contracts.AppendKeepAliveFrame(nil, link.ID(), link.ID()+"-"+strconv.Itoa(w.cycles), false))
}

// PeerRefusal is the reader's answer refusing the stream: Text is the error text it sent (the
// peer's words: never logged); it is relay-request-invalid by name.
type PeerRefusal struct {
	Text string
	ref  *contracts.Refusal
}

func (e *PeerRefusal) Error() string { return e.ref.Error() }
func (e *PeerRefusal) Unwrap() error { return e.ref }
