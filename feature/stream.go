package feature

import "encoding/json"

// Two small ports for a part that carries bytes of its own to and from Cloudly (the platform
// agent's database closures): a share of the relay's peer memory budget, and one end of a
// VirtualStream on the Cloudly socket. The relay's Upstream implements both; a part that needs
// them checks the Upstream it is handed for each (up.(feature.Memory), up.(feature.Streams)).

// Memory is the relay's peer memory budget (docs/hostile.md) as a part charges it.
type Memory interface {
	// NewShare opens a share of the budget capped at limit bytes. It is never evicted: its owner
	// bounds what it holds and gives up (a refused Charge) rather than being closed.
	NewShare(limit int64) Share
}

// Share is one part's slice of the budget. A charge is released exactly once, when its bytes are
// written or dropped.
type Share interface {
	// Charge takes n bytes when they fit the share's cap and the budget, and reports whether they
	// did; nothing is taken when they do not.
	Charge(n int) bool
	// Release gives back n bytes charged earlier.
	Release(n int)
	// Close: the owner is done. Bytes still charged are released as their frames are written or
	// dropped.
	Close()
}

// Streams lets a part be one end of a VirtualStream with Cloudly (docs/protocol.md#streams): Cloudly's frames
// for the stream reach the part's StreamReader, never a node; the part's frames go up whole.
type Streams interface {
	// OpenStream opens a stream under a fresh id on the attached socket: for a body the relay
	// sends that carries the stream's marker. Its frames are charged to share, which must come
	// from the same relay's Memory.NewShare, until written.
	OpenStream(share Share, r StreamReader) (Stream, error)
	// AcceptStream takes the stream id that Cloudly named (a marker in its answer). Call it in
	// the done of the call whose answer names the stream: an Upstream call's done runs on the
	// socket's read loop before Cloudly's next frame is read, so no frame of the stream is missed.
	AcceptStream(id string, share Share, r StreamReader) (Stream, error)
}

// StreamReader hears Cloudly's frames for one stream — requests and answers, whole and untouched
// — on the socket's read loop, in the order Cloudly sent them. It must not block; the frame is the
// reader's to keep.
type StreamReader interface {
	StreamFrame(frame []byte)
}

// Stream is one end of a VirtualStream with Cloudly.
type Stream interface {
	// ID is the streamId its marker and frames carry.
	ID() string
	// Send queues a whole frame to Cloudly, charged to the stream's share until written. It never
	// blocks: relay-node-busy past the share, relay-upstream-busy when the socket's queue is full,
	// relay-upstream-detached once the socket the stream is on is gone.
	Send(frame []byte) error
	// Call sends a request whose body carries this stream's marker, on the stream's socket: the
	// call lives as long as the stream moves (each frame either way gives it another call
	// timeout). done as for Upstream.Call.
	Call(method string, body json.RawMessage, done Reply)
	// Done is closed when the stream has ended: Close, or the socket it is on was lost.
	Done() <-chan struct{}
	// Close ends the stream: Cloudly's further frames for it are refused relay-stream-unknown.
	Close()
}
