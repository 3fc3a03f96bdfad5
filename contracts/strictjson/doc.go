// Package strictjson is the one strict JSON reader of the relay, its canonical encoder, and the
// JSON forms of bytes JavaScript writes. Everything a peer sends is read through it (by contracts,
// which holds the shapes and rules, and by the framing), so that the relay and the peer behind it
// can never read one body two ways; json.go says how. It imports only the standard library.
package strictjson
