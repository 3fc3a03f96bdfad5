// Package escrow holds the DNS lease renewal runs Cloudly signs ahead of time and releases them to
// the nodes while the relay is cut off from Cloudly (SPEC §6). Runs live in memory only; the
// package holds no key and verifies no signature.
package escrow
