// Package typedsocket is the TypedRequest-over-WebSocket framing the relay speaks on every socket
// (docs/protocol.md#framing-typedrequest-over-websocket, project-defined framing of the seeds' TypedSocket transport): one JSON envelope per
// WebSocket text message, requests and answers in both directions, correlated by id.
//
// A Conn owns one WebSocket. Its read loop decodes each message and either hands a request to the
// Handler (on the read loop, so a peer's requests are seen in order) or completes a pending call;
// its send loop writes frames from a bounded queue and pings. Bodies are never decoded or
// re-encoded: they travel as the raw bytes the peer sent.
//
// Every request a Conn sends takes one path (call.go): CallAsync sends it and hands its outcome
// to a callback, Call is CallAsync that waits, and CallOptions say what the request is charged to
// (Charge), which node it states (ForNode), how long it waits (Timeout) and who sees its outcome
// first (Observe). SendFrame forwards a frame already encoded, charged the same way.
//
// The package never logs a body and never judges one beyond the envelope itself.
package typedsocket
