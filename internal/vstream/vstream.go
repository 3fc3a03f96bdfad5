// Package vstream is one end of a VirtualStream as the published TypedRequest library carries
// one: the writer that pushes a byte stream chunk by chunk, and the reader that takes it. The
// relay's platform agent writes database backups to Cloudly and reads restores from it with it;
// the simulator's Cloudly is the other end of both, with the same code.
//
// On the wire (the frames themselves are built and read by package contracts), the writer sends
// one chunk frame and waits for the reader's answer to it (same cycleId) before the next; while
// the answer says backpressure it asks again with a feedback frame every FeedbackEvery; a
// keep-alive goes every KeepAliveEvery while it waits; the closing chunk ends the stream, and a
// keep-alive false aborts it. Chunk data goes as the library encodes a Node.js Buffer; the reader
// reads every encoding the library writes.
//
// What either end holds is bounded whatever the stream's size: the writer one read buffer and two
// frames (the next chunk is read and encoded while the reader takes the current one), the reader
// at most Queue chunks, each charged to a Budget until it has been read.
//
// Failures are *contracts.Refusal values by name: relay-closure-stalled when the other end moved
// nothing for the idle bound, relay-request-invalid for a stream past its limit, a chunk in no
// encoding the library writes or a refused stream, relay-upstream-detached when the other end or
// the link ended it, relay-node-busy for a writer that does not wait for its answers.
package vstream

import (
	"errors"
	"time"

	"k8s.io/utils/clock"
)

// Link is the path one stream's frames take to the other end.
type Link interface {
	// ID is the streamId the frames carry.
	ID() string
	// Send queues one whole frame; it never blocks.
	Send(frame []byte) error
	// Done is closed when the path is gone.
	Done() <-chan struct{}
}

// Budget is memory charged while a chunk is held; feature.Share is one.
type Budget interface {
	Charge(n int) bool
	Release(n int)
}

// The library's cadences.
const (
	DefaultKeepAliveEvery = time.Second
	DefaultFeedbackEvery  = 50 * time.Millisecond
	DefaultIdle           = 60 * time.Second
	DefaultQueue          = 4
)

// ErrStopped: the owner's stop channel closed (unless the options name another error).
var ErrStopped = errors.New("vstream: stopped by its owner")

// ErrEndedEarly: the writer's ended channel closed before the closing chunk was answered (the
// call the stream belongs to was answered first).
var ErrEndedEarly = errors.New("vstream: the call was answered before the stream ended")

func orReal(c clock.WithTicker) clock.WithTicker {
	if c == nil {
		return clock.RealClock{}
	}
	return c
}
