// Package escrow holds the DNS lease renewal runs Cloudly signs ahead of time and releases them to
// the nodes while the relay is cut off from Cloudly (docs/escrow.md). It owns the runs and the release
// schedule; it never holds a key, verifies or makes a signature, writes anything to disk, or logs
// more of a run than its node, count, sequences and windows.
//
// # Flow
//
//	Cloudly ──holdRuntimeNetworkDnsLeaseRenewals { nodeId, projection, renewals }──► relay ─► Escrow.Hold
//	        ◄──────────────── { held } or "<escrow refusal>: <reason>" ──────────────
//	                 … the Cloudly session is lost: Detached …
//	relay ──applyRuntimeNetworkDnsLeaseRenewal { session, signed }──► node   (the newest current window)
//	      ◄──────────────── { status, renewal } bound to the renewal sent ────────
//
// The rules:
//
//   - Hold judges a run in a fixed order (escrow-cloudly-only, escrow-run-invalid,
//     escrow-node-not-carried, escrow-run-foreign-session, escrow-run-unordered, escrow-run-stale)
//     and keeps it in a compact form: the signed envelopes back to back, exactly as received, and
//     64 bytes per renewal. A run replaces the node's run; an empty run clears it.
//   - While detached, each node carried with a run gets the newest renewal whose window is current
//     (notBefore <= now < expiresAt) once its slot opens, never before, under the session binding
//     the node obtained itself. A renewal the node acknowledged in its current session is not
//     pushed again; a new session (NodeBound) gets the current one again. A refusal or failure is
//     retried with a bounded backoff while the window lasts (scheduler.go).
//   - While attached nothing is released. CustodyEnded drops every run; a run whose last window has
//     ended is dropped.
//
// The release schedule is the scheduler type: no I/O, no clock of its own, one heap for all nodes.
// Escrow wraps it with a mutex, an injected clock and one timer driven by Run. The relay reaches it
// through relay.go: the method it serves, what it observes, Run and Ready.
package escrow
