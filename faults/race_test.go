//go:build race

package faults

// raceEnabled: the race detector slows the flood's own TLS handshakes (run in this process) far
// more than the hub's forwarding, so packet-loss figures mean nothing under it.
const raceEnabled = true
