package vstream

import (
	"sync"
	"testing"

	"code.foss.global/serve.zone/relay/contracts"
)

// captureLink keeps every frame sent on it.
type captureLink struct {
	id   string
	mu   sync.Mutex
	sent [][]byte
}

func (l *captureLink) ID() string { return l.id }
func (l *captureLink) Send(f []byte) error {
	l.mu.Lock()
	l.sent = append(l.sent, append([]byte(nil), f...))
	l.mu.Unlock()
	return nil
}
func (l *captureLink) Done() <-chan struct{} { return nil }

// TestAnswer: an end that keeps no reader for a stream answers its request frames exactly as a
// reader with room does; it never answers an answer, nor a frame it cannot read.
func TestAnswer(t *testing.T) {
	const (
		alive    = `{"method":"##VirtualStream##","request":{"streamId":"s","cycleId":"c1","cycle":"request","mainPurpose":"keepAlive","keepAlive":true,"n":12345678901234567890},"response":null}`
		aborted  = `{"method":"##VirtualStream##","request":{"streamId":"s","cycleId":"c2","cycle":"request","mainPurpose":"keepAlive","keepAlive":false},"response":null}`
		feedback = `{"method":"##VirtualStream##","request":{"streamId":"s","cycleId":"c3","cycle":"request","mainPurpose":"feedback"},"response":null,"correlation":{"id":"k","phase":"request"}}`
	)
	for _, frame := range []string{alive, feedback, aborted} { // the abort last: it ends the reader's stream
		l := &captureLink{id: "s"}
		rd := NewReader(ReaderOptions{})
		rd.Attach(l)
		rd.StreamFrame([]byte(frame))
		got, ok := Answer([]byte(frame))
		if !ok || len(l.sent) != 1 || string(got) != string(l.sent[0]) {
			t.Fatalf("Answer(%s) = %s, %v; a reader answers %q", frame, got, ok, l.sent)
		}
	}
	got, ok := Answer([]byte(aborted))
	if a, err := contracts.ReadStreamFrameBody(got); !ok || err != nil || a.Response.MainPurpose != "keepAlive" || !a.Response.HasKeepAlive || a.Response.KeepAlive {
		t.Fatalf("an abort's answer %s does not say keepAlive false", got)
	}

	closing := contracts.AppendChunkFrame(nil, "s", "c4", nil, false, true)
	got, ok = Answer(closing)
	a, err := contracts.ReadStreamFrameBody(got)
	if !ok || err != nil || a.Request.Present || a.Response.StreamID != "s" || a.Response.CycleID != "c4" || a.Response.MainPurpose != "feedback" {
		t.Fatalf("a chunk's answer is %s, want feedback for c4 with request null", got)
	}

	for _, frame := range []string{
		string(contracts.AppendStreamAnswer(nil, contracts.StreamAnswer{StreamID: "s", CycleID: "c", Purpose: "feedback"})),
		`{"method":"##VirtualStream##","request":null,"response":null}`,
		`{"method":"##VirtualStream##","request":{"streamId":"s"},"request":{"streamId":"t"}}`,
		`not json`,
	} {
		if got, ok := Answer([]byte(frame)); ok {
			t.Errorf("Answer(%s) answered %s", frame, got)
		}
	}
}

// FuzzAnswer: whatever arrives, Answer does not panic, and what it answers is an answer for the
// request's stream and cycle, with no request of its own to answer back.
func FuzzAnswer(f *testing.F) {
	f.Add([]byte(`{"method":"##VirtualStream##","request":{"streamId":"s","cycleId":"c","cycle":"request","mainPurpose":"keepAlive","keepAlive":true},"response":null}`))
	f.Add(contracts.AppendChunkFrame(nil, "s", "c", []byte("abc"), true, false))
	f.Add(contracts.AppendFeedbackFrame(nil, "s", "c"))
	f.Fuzz(func(t *testing.T, frame []byte) {
		got, ok := Answer(frame)
		if !ok {
			return
		}
		req, _ := contracts.ReadStreamFrameBody(frame)
		a, err := contracts.ReadStreamFrameBody(got)
		if err != nil || !a.Response.Present || a.Response.Cycle != "response" ||
			a.Response.StreamID != req.Request.StreamID || a.Response.CycleID != req.Request.CycleID {
			t.Fatalf("Answer(%q) = %q (%v)", frame, got, err)
		}
		if again, ok := Answer(got); ok {
			t.Fatalf("the answer %q would be answered back: %q", got, again)
		}
	})
}
