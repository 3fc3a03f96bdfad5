// Package corestore is the relay's HTTP client for node Corestores (docs/protocol.md#isolated-restore-and-corestore). It carries one
// isolated-restore control at a time: POST <origin>/isolated-restore/<op> with the control bytes
// as the body, exactly as given, and nothing added. It verifies TLS (system roots plus extra roots
// the operator names), bounds the connect time, the whole call and the answer's size, follows no
// redirect, and classifies every failure by the seed's names: restore-node-unreachable for dial,
// TLS and timeout failures, restore-node-refused: <Corestore's own reason> for a non-2xx answer.
//
// It never logs, stores or quotes a control: the control holds a bearer grant. A Corestore reason
// is bounded and sanitized before it travels on, so a Corestore that echoes the grant cannot make
// the relay repeat it. It does not read Corestore's answer either; package restore does.
package corestore
