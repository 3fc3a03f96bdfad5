package vstream

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"code.foss.global/serve.zone/relay/contracts"
)

// pipeLink delivers each frame to the other end's StreamFrame on a goroutine of its own, in
// order, as a socket's read loop would; tap sees every frame sent.
type pipeLink struct {
	id   string
	to   func([]byte)
	q    chan []byte
	done chan struct{}
	once sync.Once
	tap  func([]byte)
}

func newPipe(id string, to func([]byte)) *pipeLink {
	l := &pipeLink{id: id, to: to, q: make(chan []byte, 256), done: make(chan struct{})}
	go func() {
		for {
			select {
			case f := <-l.q:
				l.to(f)
			case <-l.done:
				return
			}
		}
	}()
	return l
}

func (l *pipeLink) ID() string { return l.id }
func (l *pipeLink) Send(f []byte) error {
	if l.tap != nil {
		l.tap(f)
	}
	select {
	case <-l.done:
		return errors.New("gone")
	case l.q <- append([]byte(nil), f...):
		return nil
	}
}
func (l *pipeLink) Done() <-chan struct{} { return l.done }
func (l *pipeLink) close()                { l.once.Do(func() { close(l.done) }) }

// TestWriterToReader, on a fake clock: a stream of 3½ chunks arrives whole through a reader that
// reads slowly; at most one chunk is in flight and the reader's budget is back to zero after.
func TestWriterToReader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		data := bytes.Repeat([]byte("0123456789abcdef"), 3584) // 56 KiB: 3.5 chunks of 16 KiB
		budget := &countBudget{}
		rd := NewReader(ReaderOptions{Budget: budget})
		w := NewWriter(WriterOptions{ChunkBytes: 16 << 10})
		toReader := newPipe("s-1", rd.StreamFrame)
		toWriter := newPipe("s-1", w.StreamFrame)
		defer toReader.close()
		defer toWriter.close()
		rd.Attach(toWriter)
		var unanswered, most int
		var mu sync.Mutex
		toReader.tap = func(f []byte) {
			if b, _ := contracts.ReadStreamFrameBody(f); b.Request.MainPurpose == "chunk" {
				mu.Lock()
				unanswered++
				most = max(most, unanswered)
				mu.Unlock()
			}
		}
		toWriter.tap = func(f []byte) {
			if b, _ := contracts.ReadStreamFrameBody(f); b.Response.MainPurpose == "feedback" {
				mu.Lock()
				unanswered--
				mu.Unlock()
			}
		}
		got := make(chan []byte)
		go func() {
			var out []byte
			buf := make([]byte, 1000)
			for {
				<-time.After(10 * time.Millisecond) // a slow consumer, on the bubble's clock
				n, err := rd.Read(buf)
				out = append(out, buf[:n]...)
				if err != nil {
					got <- out
					return
				}
			}
		}()
		n, err := w.Write(toReader, bytes.NewReader(data))
		if err != nil || n != int64(len(data)) {
			t.Fatalf("wrote %d, %v", n, err)
		}
		if out := <-got; !bytes.Equal(out, data) {
			t.Fatalf("read %d bytes, want %d", len(out), len(data))
		}
		if most != 1 {
			t.Fatalf("%d chunks in flight at once", most)
		}
		if budget.n != 0 {
			t.Fatalf("budget holds %d after the stream", budget.n)
		}
	})
}

// TestReaderStalls: a writer that sends nothing for the idle bound ends the read with
// relay-closure-stalled; one that aborts ends it with relay-upstream-detached and Aborted.
func TestReaderStalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rd := NewReader(ReaderOptions{Idle: 30 * time.Second})
		back := newPipe("s-2", func([]byte) {})
		defer back.close()
		rd.Attach(back)
		start := time.Now()
		_, err := rd.Read(make([]byte, 10))
		if !errors.Is(err, contracts.RelayClosureStalled) || time.Since(start) != 30*time.Second {
			t.Fatalf("after %s: %v", time.Since(start), err)
		}

		rd = NewReader(ReaderOptions{})
		rd.Attach(back)
		rd.StreamFrame(contracts.AppendKeepAliveFrame(nil, "s-2", "c-1", false))
		if _, err := rd.Read(make([]byte, 10)); !errors.Is(err, contracts.RelayUpstreamDetached) || !rd.Aborted() {
			t.Fatalf("aborted: %v %v", err, rd.Aborted())
		}
	})
}

// TestWriterStallsAndBackpressure: a reader that says backpressure is asked again every
// FeedbackEvery and the chunk's wait ends relay-closure-stalled at the idle bound; a refusing
// reader's text reaches the writer; keep-alives go every second meanwhile.
func TestWriterStallsAndBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := NewWriter(WriterOptions{ChunkBytes: 4, Idle: 5 * time.Second})
		var feedbacks, keepAlives int
		var back *pipeLink
		toReader := newPipe("s-3", func(f []byte) {
			b, _ := contracts.ReadStreamFrameBody(f)
			switch b.Request.MainPurpose {
			case "chunk", "feedback":
				if b.Request.MainPurpose == "feedback" {
					feedbacks++
				}
				back.Send(contracts.AppendStreamAnswer(nil, contracts.StreamAnswer{StreamID: "s-3", CycleID: b.Request.CycleID,
					Purpose: "feedback", Backpressure: true}))
			case "keepAlive":
				keepAlives++
			}
		})
		back = newPipe("s-3", w.StreamFrame)
		defer toReader.close()
		defer back.close()
		start := time.Now()
		_, err := w.Write(toReader, bytes.NewReader([]byte("abcdefgh")))
		if !errors.Is(err, contracts.RelayClosureStalled) || time.Since(start) != 5*time.Second {
			t.Fatalf("after %s: %v", time.Since(start), err)
		}
		synctest.Wait()
		if feedbacks < 90 || keepAlives < 4 || keepAlives > 5 { // the fifth is due with the idle bound, at the same instant
			t.Fatalf("%d feedback requests, %d keep-alives in 5 s", feedbacks, keepAlives)
		}

		w = NewWriter(WriterOptions{ChunkBytes: 4})
		back2 := newPipe("s-4", w.StreamFrame)
		defer back2.close()
		refuser := newPipe("s-4", func(f []byte) {
			b, _ := contracts.ReadStreamFrameBody(f)
			back2.Send(contracts.AppendStreamAnswer(nil, contracts.StreamAnswer{StreamID: "s-4", CycleID: b.Request.CycleID,
				Purpose: "feedback", Refusal: contracts.RelayNodeBusy.Refuse("full")}))
		})
		defer refuser.close()
		_, err = w.Write(refuser, bytes.NewReader([]byte("abcdefgh")))
		var pr *PeerRefusal
		if !errors.As(err, &pr) || pr.Text != "relay-node-busy: full" || !errors.Is(err, contracts.RelayRequestInvalid) {
			t.Fatalf("refused: %v", err)
		}
	})
}

// TestLimits: past the limit the writer stops reading and the reader refuses the chunk.
func TestLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := NewWriter(WriterOptions{ChunkBytes: 4, Limit: 6})
		reply := newPipe("s-5", w.StreamFrame)
		defer reply.close()
		sink := newPipe("s-5", func(f []byte) { // answers each chunk
			b, _ := contracts.ReadStreamFrameBody(f)
			reply.Send(contracts.AppendStreamAnswer(nil, contracts.StreamAnswer{StreamID: "s-5", CycleID: b.Request.CycleID, Purpose: "feedback"}))
		})
		defer sink.close()
		if _, err := w.Write(sink, io.LimitReader(bytes.NewReader(make([]byte, 100)), 100)); !errors.Is(err, contracts.RelayRequestInvalid) {
			t.Fatalf("writer past its limit: %v", err)
		}
		rd := NewReader(ReaderOptions{Limit: 3})
		var answers [][]byte
		back := newPipe("s-5", func(f []byte) { answers = append(answers, f) })
		defer back.close()
		rd.Attach(back)
		rd.StreamFrame(contracts.AppendChunkFrame(nil, "s-5", "c-1", []byte("abcd"), true, false))
		if _, err := rd.Read(make([]byte, 10)); !errors.Is(err, contracts.RelayRequestInvalid) {
			t.Fatalf("reader past its limit: %v", err)
		}
		synctest.Wait()
		if len(answers) != 1 {
			t.Fatalf("answers %d", len(answers))
		}
		if b, _ := contracts.ReadStreamFrameBody(answers[0]); b.ErrorText == "" {
			t.Fatal("the chunk past the limit was not refused")
		}
	})
}

type countBudget struct {
	mu sync.Mutex
	n  int
}

func (b *countBudget) Charge(n int) bool { b.mu.Lock(); b.n += n; b.mu.Unlock(); return true }
func (b *countBudget) Release(n int)     { b.mu.Lock(); b.n -= n; b.mu.Unlock() }
