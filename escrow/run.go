package escrow

import (
	"encoding/hex"
	"encoding/json"
	"sort"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// heldRun is one node's run in the compact form the relay keeps for hours: the signed envelopes
// back to back in one buffer, exactly as Cloudly sent them, and per renewal only what release
// needs. A run is immutable once built, so releases may read it without a lock.
type heldRun struct {
	projection contracts.ProjectionReference // the run's one projection
	controller []byte                        // canonical JSON of the run's controller
	namespace  string                        // the run's runtimeNamespace
	envelopes  []byte                        // every signed envelope, back to back
	renewals   []heldRenewal                 // ascending sequence, extending windows
}

// heldRenewal is 64 bytes; the envelope is envelopes[previous end:end].
type heldRenewal struct {
	sequence  int64
	notBefore int64 // Unix ms
	expiresAt int64 // Unix ms
	end       uint32
	digest    [32]byte
}

// newHeldRun copies a valid, ordered, non-empty request into its compact form. Nothing of the
// request's buffer is kept.
func newHeldRun(h *contracts.HoldRuntimeNetworkDnsLeaseRenewalsRequest) *heldRun {
	size := 0
	for _, s := range h.Renewals {
		size += len(s.Raw)
	}
	first := h.Renewals[0].Renewal
	controller, _ := strictjson.Canonicalize(first.Controller) // the reader checked it has a canonical form
	run := &heldRun{
		projection: h.Projection,
		controller: controller,
		namespace:  first.RuntimeNamespace,
		envelopes:  make([]byte, 0, size),
		renewals:   make([]heldRenewal, len(h.Renewals)),
	}
	for i, s := range h.Renewals {
		run.envelopes = append(run.envelopes, s.Raw...)
		r := &run.renewals[i]
		r.sequence, r.notBefore, r.expiresAt = s.Renewal.Sequence, s.Renewal.Dns.NotBefore, s.Renewal.Dns.ExpiresAt
		r.end = uint32(len(run.envelopes))
		hex.Decode(r.digest[:], []byte(s.Renewal.Digest[len("sha256:"):])) // the reader checked the form
	}
	return run
}

// envelope is renewal i's signed envelope, the bytes Cloudly sent.
func (r *heldRun) envelope(i int) json.RawMessage {
	start := uint32(0)
	if i > 0 {
		start = r.renewals[i-1].end
	}
	return r.envelopes[start:r.renewals[i].end:r.renewals[i].end]
}

// reference is renewal i's { projection, sequence, digest }, what the node's answer must repeat.
func (r *heldRun) reference(i int) contracts.RuntimeNetworkDnsLeaseRenewalReference {
	return contracts.RuntimeNetworkDnsLeaseRenewalReference{
		Projection: r.projection, Sequence: r.renewals[i].sequence,
		Digest: "sha256:" + hex.EncodeToString(r.renewals[i].digest[:]),
	}
}

// lastExpires is when the run's last window ends: the run is dropped then.
func (r *heldRun) lastExpires() int64 { return r.renewals[len(r.renewals)-1].expiresAt }

// current is the index of the newest renewal whose window is current at now (notBefore <= now <
// expiresAt), or -1. notBefore never moves back and expiresAt only grows along a run, so the
// current windows are consecutive and the newest is the last one already open.
func (r *heldRun) current(now int64) int {
	k := r.nextSlot(now) - 1
	if k < 0 || now >= r.renewals[k].expiresAt {
		return -1
	}
	return k
}

// nextSlot is the index of the first renewal whose slot has not opened at now (notBefore > now),
// or len(renewals).
func (r *heldRun) nextSlot(now int64) int {
	return sort.Search(len(r.renewals), func(i int) bool { return r.renewals[i].notBefore > now })
}

// inScope reports whether the run's scope is a session's controller (canonical JSON) and
// namespace. The node id is the key the run is held under.
func (r *heldRun) inScope(controller []byte, namespace string) bool {
	return string(r.controller) == string(controller) && r.namespace == namespace
}

// span is the run's first and last sequence and its first notBefore and last expiresAt: all a
// log may say about a run.
func (r *heldRun) span() (firstSeq, lastSeq, from, to int64) {
	first, last := r.renewals[0], r.renewals[len(r.renewals)-1]
	return first.sequence, last.sequence, first.notBefore, last.expiresAt
}
