package typedsocket

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingShare is a Share that counts every byte charged to it for sending and refuses past
// limit; what it holds of messages received is not counted.
type countingShare struct {
	limit   int64
	held    atomic.Int64
	charged atomic.Int64 // every byte ever taken by Charge
}

func (s *countingShare) Charge(n int) bool {
	if s.held.Add(int64(n)) > s.limit {
		s.held.Add(-int64(n))
		return false
	}
	s.charged.Add(int64(n))
	return true
}
func (s *countingShare) ChargeWait(n int, _, _ <-chan struct{}) bool { return s.Charge(n) }
func (s *countingShare) ChargeIncoming(n int, _ <-chan struct{}) bool {
	s.held.Add(int64(n))
	return true
}
func (s *countingShare) Refusal(n int)  { s.held.Add(int64(n)) }
func (s *countingShare) Release(n int)  { s.held.Add(-int64(n)) }
func (s *countingShare) Limit() int64   { return s.limit }
func (s *countingShare) taken() int64   { return s.charged.Load() }
func (s *countingShare) holding() int64 { return s.held.Load() }

// TestCallOptions: every request takes one path, and each option changes only what it names —
// Charge moves the request's bytes to another share (nil: none) and refuses what does not fit,
// ForNode states relayNodeId, Timeout replaces ctx's deadline, Observe sees the outcome before
// it is delivered.
func TestCallOptions(t *testing.T) {
	var mu sync.Mutex
	nodes := map[string]string{}
	_, cli := pair(t, Options{Handler: HandlerFunc(func(_ *Conn, r *Request) {
		if r.Method == "hold" {
			return // never answered: the call can only time out
		}
		mu.Lock()
		nodes[r.Method] = string(r.RelayNodeRaw)
		mu.Unlock()
		r.Respond(r.Body)
	})}, Options{Share: &countingShare{limit: 1 << 20}})
	own := cli.opts.Share.(*countingShare)
	ctx := context.Background()
	body := json.RawMessage(`{"x":1}`)

	t.Run("Charge", func(t *testing.T) {
		if _, err := cli.Call(ctx, "m", body); err != nil || own.taken() == 0 {
			t.Fatalf("a call without options: %v, %d bytes charged to the connection's share", err, own.taken())
		}
		before := own.taken()
		other := &countingShare{limit: 1 << 20}
		if _, err := cli.Call(ctx, "m", body, Charge(other)); err != nil || other.taken() == 0 || own.taken() != before {
			t.Fatalf("Charge(other): %v; other took %d, own took %d more", err, other.taken(), own.taken()-before)
		}
		if _, err := cli.Call(ctx, "m", body, Charge(nil)); err != nil || own.taken() != before {
			t.Fatalf("Charge(nil): %v; own took %d more", err, own.taken()-before)
		}
		tiny := &countingShare{limit: 8}
		if _, err := cli.CallAsync("m", body, func(Reply) { t.Error("done called for a refused call") }, Charge(tiny)); !errors.Is(err, ErrOverShare) {
			t.Fatalf("a request over its share: %v, want ErrOverShare", err)
		}
		frame := []byte(`{"method":"##VirtualStream##","request":{"streamId":"s"},"response":null}`)
		if err := cli.SendFrame(frame, Charge(tiny)); !errors.Is(err, ErrOverShare) {
			t.Fatalf("a frame over its share: %v, want ErrOverShare", err)
		}
		if err := cli.SendFrame(frame, Charge(other)); err != nil {
			t.Fatal(err)
		}
		if tiny.holding() != 0 || other.taken() < int64(len(frame)) {
			t.Fatalf("refusals left %d bytes held; the frame charged %d", tiny.holding(), other.taken())
		}
	})

	t.Run("ForNode", func(t *testing.T) {
		if _, err := cli.Call(ctx, "stated", body, ForNode("node-a")); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Call(ctx, "unstated", body); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if nodes["stated"] != `"node-a"` || nodes["unstated"] != "" {
			t.Fatalf("relayNodeId as served: stated %q, unstated %q", nodes["stated"], nodes["unstated"])
		}
	})

	t.Run("Timeout", func(t *testing.T) {
		long, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := cli.Call(long, "hold", body, Timeout(20*time.Millisecond))
		if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "after 20ms") {
			t.Fatalf("Timeout(20ms) under a 5 s deadline: %v", err)
		}
	})

	t.Run("Observe", func(t *testing.T) {
		var order []string // appended on the read loop, read after done
		done := make(chan struct{})
		if _, err := cli.CallAsync("m", body, func(Reply) { order = append(order, "done"); close(done) },
			Observe(func(r Reply) { order = append(order, "observe:"+string(r.Response)) })); err != nil {
			t.Fatal(err)
		}
		<-done
		if strings.Join(order, " ") != `observe:{"x":1} done` {
			t.Fatalf("order %q", order)
		}
		var seen Reply
		got, err := cli.Call(ctx, "m", body, Observe(func(r Reply) { seen = r }))
		if err != nil || string(seen.Response) != string(got) {
			t.Fatalf("Call returned %s, %v before observe saw %s", got, err, seen.Response)
		}
	})
}
