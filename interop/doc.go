// Package interop runs the relay against peers built on the published TypedRequest library
// (`@api.global/typedrequest`, the reference docs/protocol.md#sources-and-conventions names for what real peers put on the wire):
// a Cloudly and Pallet nodes written in Node.js (peers/*.mjs), a real relay process between them,
// and the same peers talking directly as the baseline. The conformance suite (interop_test.go)
// and the stream benchmark (bench/streams.go) drive them through this package.
//
// The flow of one run:
//
//	Cloudly (node peers/cloudly.mjs)  ◄── ws ──  relay run …  ◄── ws ──  nodes (node peers/nodes.mjs)
//	Cloudly (node peers/cloudly.mjs)  ◄────────────── ws ──────────────  nodes   (direct baseline)
//
// Each Node.js process takes commands on standard input and answers on standard output, one
// JSON object a line; the library's console output goes to standard error, of which a tail is
// kept for failure reports. Every frame on a peer socket is exactly what the library builds and
// reads: the transport under it (peers/transport.mjs) only moves and correlates frames.
//
// The packages are installed by `bash interop/install.sh` (Node.js ≥ 18 and npm needed); Ready
// says what is missing. This package never changes the relay: it builds or runs a binary.
package interop
