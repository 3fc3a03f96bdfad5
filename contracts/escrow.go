package contracts

import (
	"encoding/json"
	"errors"
	"strconv"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// DNS lease renewals and their escrow (docs/escrow.md).
//
// Cloudly signs renewals of a node's DNS window ahead of time and hands the elected relay a run of
// them with holdRuntimeNetworkDnsLeaseRenewals; while the relay has no Cloudly session it pushes
// the current one to the node with applyRuntimeNetworkDnsLeaseRenewal. The relay verifies no
// signature: an envelope's authority and signature are opaque JSON values, and the signed
// envelope is released exactly as it was received.

// Seed-defined limits.
const (
	// MaximumEscrowedRenewals is maximumEscrowedRenewals: the most renewals one run holds.
	MaximumEscrowedRenewals = 32
	// MaximumEscrowHorizonMs is maximumEscrowHorizonMs, four hours: the most a run spans from its
	// first window's issuedAt to its last window's expiresAt.
	MaximumEscrowHorizonMs = 4 * 60 * 60 * 1000
	// MaximumDnsLeaseMs is maximumDnsLeaseMs, fifteen minutes: the longest DNS window, measured
	// from its slot (issuedAt).
	MaximumDnsLeaseMs = 15 * 60 * 1000
)

// The renewal digest rule. The interfaces readme requires the check ("validateHoldRuntimeNetwork-
// DnsLeaseRenewalsRequest adds every renewal's digest check") and says what is hashed
// ("computeRuntimeNetworkDnsLeaseRenewalDigest hashes every field except digest under its own
// domain"), but spells neither the domain nor the preimage. The rule the relay computes is this
// project's assumption and lives here alone: the domain below, the preimage of Digest (digest.go:
// the UTF-8 domain, one "\n", the canonical JSON of the renewal without digest) and the golden
// vectors under testdata/digest that pin it.
//
// RuntimeNetworkDnsLeaseRenewalDigestDomain is the domain computeRuntimeNetworkDnsLeaseRenewalDigest
// hashes under (project-defined: the seeds name "its own domain" without spelling it).
const RuntimeNetworkDnsLeaseRenewalDigestDomain = "serve.zone/runtime-network-dns-lease-renewal"

// RenewalDigestVerified states that the rule above has been verified against a renewal a real
// Cloudly digested. While it is false, a renewal whose digest is well formed but is not the one
// the rule computes is read all the same, marked DigestUnverified: the relay holds it, counts and
// shows it (relay_escrow_digest_unverified_total, the escrow's status), and the node, which
// verifies digest and signature before it applies anything, remains the authority. Set it to true
// once a real peer's renewal reproduces under the rule (and its golden vector is added): the same
// digest then refuses the run escrow-run-invalid. A digest that is not sha256: and 64 lowercase hex
// digits is escrow-run-invalid either way.
const RenewalDigestVerified = false

// Project-defined: the status values of IApplyRuntimeNetworkDnsLeaseRenewalResponse. The
// seed's admission text answers a byte-identical re-delivery "as replay"; a new renewal is
// accepted.
const (
	ApplyStatusAccepted = "accepted"
	ApplyStatusReplay   = "replay"
)

// ProjectionReference is the { id, generation, digest } reference a renewal names the projection
// it renews by. Two references are equal as JSON values exactly when the structs are equal: the
// shape is exact and every member is a string or a safe integer.
type ProjectionReference struct {
	ID         string // canonical identifier
	Generation int64  // non-negative safe integer
	Digest     string // sha256:<64 lowercase hex>
}

// AppendJSON appends the reference as JSON.
func (p ProjectionReference) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"id":`...)
	dst = strictjson.AppendString(dst, p.ID)
	dst = append(dst, `,"generation":`...)
	dst = strconv.AppendInt(dst, p.Generation, 10)
	dst = append(dst, `,"digest":`...)
	dst = strictjson.AppendString(dst, p.Digest)
	return append(dst, '}')
}

// DnsWindow is a renewal's dns { issuedAt, notBefore, expiresAt }, Unix milliseconds. issuedAt is
// the start of the window's slot; the window is current while notBefore <= now < expiresAt.
type DnsWindow struct {
	IssuedAt  int64
	NotBefore int64
	ExpiresAt int64
}

// Current reports whether the window is current at now (Unix ms).
func (w DnsWindow) Current(now int64) bool { return w.NotBefore <= now && now < w.ExpiresAt }

// RuntimeNetworkDnsLeaseRenewal is IRuntimeNetworkDnsLeaseRenewal.
type RuntimeNetworkDnsLeaseRenewal struct {
	Controller       json.RawMessage // an object, compared as a JSON value
	NodeID           string
	RuntimeNamespace string
	Projection       ProjectionReference
	Sequence         int64
	Dns              DnsWindow
	Digest           string
	// DigestUnverified, as read: the digest is well formed but not the one the relay's rule
	// computes (never set while RenewalDigestVerified holds: the renewal is then invalid).
	DigestUnverified bool
}

// AppendJSON appends the renewal as JSON, its keys in the seed's order, digest included.
// Controller must be a valid JSON object.
func (r RuntimeNetworkDnsLeaseRenewal) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"controller":`...)
	dst = append(dst, r.Controller...)
	dst = append(dst, `,"nodeId":`...)
	dst = strictjson.AppendString(dst, r.NodeID)
	dst = append(dst, `,"runtimeNamespace":`...)
	dst = strictjson.AppendString(dst, r.RuntimeNamespace)
	dst = append(dst, `,"projection":`...)
	dst = r.Projection.AppendJSON(dst)
	dst = append(dst, `,"sequence":`...)
	dst = strconv.AppendInt(dst, r.Sequence, 10)
	dst = append(dst, `,"dns":{"issuedAt":`...)
	dst = strconv.AppendInt(dst, r.Dns.IssuedAt, 10)
	dst = append(dst, `,"notBefore":`...)
	dst = strconv.AppendInt(dst, r.Dns.NotBefore, 10)
	dst = append(dst, `,"expiresAt":`...)
	dst = strconv.AppendInt(dst, r.Dns.ExpiresAt, 10)
	dst = append(dst, `},"digest":`...)
	dst = strictjson.AppendString(dst, r.Digest)
	return append(dst, '}')
}

// Reference is the renewal's IRuntimeNetworkDnsLeaseRenewalReference.
func (r RuntimeNetworkDnsLeaseRenewal) Reference() RuntimeNetworkDnsLeaseRenewalReference {
	return RuntimeNetworkDnsLeaseRenewalReference{Projection: r.Projection, Sequence: r.Sequence, Digest: r.Digest}
}

// ComputeRuntimeNetworkDnsLeaseRenewalDigest is computeRuntimeNetworkDnsLeaseRenewalDigest: the
// digest of the renewal object raw over every member except digest.
func ComputeRuntimeNetworkDnsLeaseRenewalDigest(raw []byte) (string, error) {
	return DigestWithout(RuntimeNetworkDnsLeaseRenewalDigestDomain, raw, "digest")
}

// DigestCheck is how a well-formed renewal digest compares with the one the relay's rule computes.
type DigestCheck uint8

const (
	DigestMatches    DigestCheck = iota // the rule reproduces it
	DigestUnverified                    // it does not, and the rule is not verified: held, counted
	DigestInvalid                       // it does not, and the rule is verified (or nothing computes): refused
)

// CheckRuntimeNetworkDnsLeaseRenewalDigest judges digest, well formed, against the renewal object
// raw under the relay's rule; strict is RenewalDigestVerified (tests pass either).
func CheckRuntimeNetworkDnsLeaseRenewalDigest(raw []byte, digest string, strict bool) DigestCheck {
	want, err := ComputeRuntimeNetworkDnsLeaseRenewalDigest(raw)
	switch {
	case err == nil && want == digest:
		return DigestMatches
	case err == nil && !strict:
		return DigestUnverified
	}
	return DigestInvalid
}

// UnverifiedDigests are the sequences of the run's renewals whose digest is DigestUnverified, in
// the run's order; nil when every digest reproduces.
func (h *HoldRuntimeNetworkDnsLeaseRenewalsRequest) UnverifiedDigests() []int64 {
	var seqs []int64
	for _, s := range h.Renewals {
		if s.Renewal.DigestUnverified {
			seqs = append(seqs, s.Renewal.Sequence)
		}
	}
	return seqs
}

// SealRuntimeNetworkDnsLeaseRenewal returns r with its digest computed: what Cloudly does before
// it signs. The relay never seals; simulators and tests do.
func SealRuntimeNetworkDnsLeaseRenewal(r RuntimeNetworkDnsLeaseRenewal) (RuntimeNetworkDnsLeaseRenewal, error) {
	r.Digest = "sha256:" + zeroHex
	d, err := ComputeRuntimeNetworkDnsLeaseRenewalDigest(r.AppendJSON(nil))
	if err != nil {
		return r, err
	}
	r.Digest = d
	return r, nil
}

const zeroHex = "0000000000000000000000000000000000000000000000000000000000000000"

// SignedRuntimeNetworkDnsLeaseRenewal is ISignedRuntimeNetworkDnsLeaseRenewal
// { authority, renewal, signature }. Raw is the envelope exactly as received: the bytes the relay
// releases, never re-encoded.
type SignedRuntimeNetworkDnsLeaseRenewal struct {
	Authority json.RawMessage // opaque; compared as a JSON value across a run
	Renewal   RuntimeNetworkDnsLeaseRenewal
	Signature json.RawMessage // opaque
	Raw       json.RawMessage
}

// AppendJSON appends the envelope: Raw when it is set, else the envelope built from Authority,
// Renewal and Signature (which must be valid JSON).
func (s SignedRuntimeNetworkDnsLeaseRenewal) AppendJSON(dst []byte) []byte {
	if s.Raw != nil {
		return append(dst, s.Raw...)
	}
	dst = append(dst, `{"authority":`...)
	dst = append(dst, s.Authority...)
	dst = append(dst, `,"renewal":`...)
	dst = s.Renewal.AppendJSON(dst)
	dst = append(dst, `,"signature":`...)
	dst = append(dst, s.Signature...)
	return append(dst, '}')
}

// HoldRuntimeNetworkDnsLeaseRenewalsRequest is IHoldRuntimeNetworkDnsLeaseRenewalsRequest
// { nodeId, projection, renewals }, as read by ReadHoldRuntimeNetworkDnsLeaseRenewalsRequest.
type HoldRuntimeNetworkDnsLeaseRenewalsRequest struct {
	NodeID     string
	Projection ProjectionReference
	Renewals   []SignedRuntimeNetworkDnsLeaseRenewal
}

// AppendJSON appends the request as JSON.
func (h *HoldRuntimeNetworkDnsLeaseRenewalsRequest) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"nodeId":`...)
	dst = strictjson.AppendString(dst, h.NodeID)
	dst = append(dst, `,"projection":`...)
	dst = h.Projection.AppendJSON(dst)
	dst = append(dst, `,"renewals":[`...)
	for i, s := range h.Renewals {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = s.AppendJSON(dst)
	}
	return append(dst, "]}"...)
}

// Span is the run's horizon: the earliest issuedAt and the latest expiresAt. For an ordered run
// they are the first window's issuedAt and the last window's expiresAt.
func (h *HoldRuntimeNetworkDnsLeaseRenewalsRequest) Span() (from, to int64) {
	for i, s := range h.Renewals {
		w := s.Renewal.Dns
		if i == 0 || w.IssuedAt < from {
			from = w.IssuedAt
		}
		if i == 0 || w.ExpiresAt > to {
			to = w.ExpiresAt
		}
	}
	return from, to
}

// holdPath names the request in reasons.
const holdPath = "hold request"

// ReadHoldRuntimeNetworkDnsLeaseRenewalsRequest reads a hold request and judges everything a relay
// can judge from the request alone except order: exact keys, identifiers and counters, at most
// MaximumEscrowedRenewals renewals, windows (at most MaximumDnsLeaseMs from issuedAt), every digest
// well formed (and, once RenewalDigestVerified, reproduced), one node, one projection, one signing authority
// revision and one scope, and a horizon of at most MaximumEscrowHorizonMs. A violation is an
// *InvalidError with one reason per violation; the relay refuses it escrow-run-invalid. Order is
// judged by OrderReasons, the scope against a session by ScopeReasons.
func ReadHoldRuntimeNetworkDnsLeaseRenewalsRequest(raw []byte) (HoldRuntimeNetworkDnsLeaseRenewalsRequest, error) {
	var h HoldRuntimeNetworkDnsLeaseRenewalsRequest
	var nodeID, projection, renewals []byte
	if strictjson.ReadExact(raw, strictjson.Req("nodeId", &nodeID), strictjson.Req("projection", &projection), strictjson.Req("renewals", &renewals)) != nil {
		return h, &InvalidError{[]string{holdPath + " must use its exact schema"}}
	}
	var reasons []string
	if s, err := strictjson.ReadString(nodeID); err != nil || !IsClusterNodeID(s) {
		reasons = append(reasons, holdPath+" nodeId must be a cluster node id")
	} else {
		h.NodeID = s
	}
	p, pr := readProjectionReference(projection, holdPath+" projection")
	reasons = append(reasons, pr...)
	h.Projection = p
	elems, err := strictjson.ReadArray(renewals)
	switch {
	case err != nil:
		reasons = append(reasons, holdPath+" renewals must be an array")
	case len(elems) > MaximumEscrowedRenewals:
		// Judging more would let a peer make the relay digest an unbounded run.
		reasons = append(reasons, holdPath+" renewals must hold at most "+strconv.Itoa(MaximumEscrowedRenewals)+" renewals")
	default:
		h.Renewals = make([]SignedRuntimeNetworkDnsLeaseRenewal, 0, len(elems))
		for i, e := range elems {
			s, r := readSignedRenewal(e, holdPath+" renewals["+strconv.Itoa(i)+"]")
			reasons = append(reasons, r...)
			h.Renewals = append(h.Renewals, s)
		}
	}
	if len(reasons) > 0 {
		return HoldRuntimeNetworkDnsLeaseRenewalsRequest{}, &InvalidError{reasons}
	}
	reasons = h.runReasons()
	if len(reasons) > 0 {
		return HoldRuntimeNetworkDnsLeaseRenewalsRequest{}, &InvalidError{reasons}
	}
	return h, nil
}

// runReasons judges a run whose renewals are each valid: one node, one projection, one signing
// authority revision, one scope, and the horizon.
func (h *HoldRuntimeNetworkDnsLeaseRenewalsRequest) runReasons() []string {
	if len(h.Renewals) == 0 {
		return nil
	}
	var reasons []string
	first := h.Renewals[0]
	firstAuthority, _ := strictjson.Canonicalize(first.Authority)
	firstController, _ := strictjson.Canonicalize(first.Renewal.Controller)
	for i, s := range h.Renewals {
		p := holdPath + " renewals[" + strconv.Itoa(i) + "]"
		r := s.Renewal
		if r.NodeID != h.NodeID {
			reasons = append(reasons, p+" renewal nodeId must be the request's nodeId")
		}
		if r.Projection != h.Projection {
			reasons = append(reasons, p+" renewal projection must equal the request's projection")
		}
		if i == 0 {
			continue
		}
		if a, _ := strictjson.Canonicalize(s.Authority); string(a) != string(firstAuthority) {
			reasons = append(reasons, p+" authority must equal the first renewal's authority")
		}
		if c, _ := strictjson.Canonicalize(r.Controller); string(c) != string(firstController) {
			reasons = append(reasons, p+" renewal controller must equal the first renewal's controller")
		}
		if r.RuntimeNamespace != first.Renewal.RuntimeNamespace {
			reasons = append(reasons, p+" renewal runtimeNamespace must equal the first renewal's runtimeNamespace")
		}
	}
	if from, to := h.Span(); to-from > MaximumEscrowHorizonMs {
		reasons = append(reasons, holdPath+" renewals must span at most "+strconv.Itoa(MaximumEscrowHorizonMs)+
			" ms from the first issuedAt to the last expiresAt")
	}
	return reasons
}

// OrderReasons judges the run's order: strictly ascending sequences, each window extending the
// one before (issuedAt and notBefore never move back, expiresAt strictly later). The relay refuses
// a violation escrow-run-unordered.
func (h *HoldRuntimeNetworkDnsLeaseRenewalsRequest) OrderReasons() []string {
	var reasons []string
	for i := 1; i < len(h.Renewals); i++ {
		prev, cur := h.Renewals[i-1].Renewal, h.Renewals[i].Renewal
		p := holdPath + " renewals[" + strconv.Itoa(i) + "]"
		if cur.Sequence <= prev.Sequence {
			reasons = append(reasons, p+" sequence must be above the previous renewal's")
		}
		if cur.Dns.IssuedAt < prev.Dns.IssuedAt {
			reasons = append(reasons, p+" dns issuedAt must not move back from the previous window's")
		}
		if cur.Dns.NotBefore < prev.Dns.NotBefore {
			reasons = append(reasons, p+" dns notBefore must not move back from the previous window's")
		}
		if cur.Dns.ExpiresAt <= prev.Dns.ExpiresAt {
			reasons = append(reasons, p+" dns expiresAt must be later than the previous window's")
		}
	}
	return reasons
}

// ScopeReasons judges the run's scope against the node's current session: every renewal's
// controller (as a JSON value), nodeId and runtimeNamespace must be the session's. The relay
// refuses a violation escrow-run-foreign-session. The run's scope is one scope already, so the
// first renewal speaks for all.
func (h *HoldRuntimeNetworkDnsLeaseRenewalsRequest) ScopeReasons(s RuntimeSession) []string {
	if len(h.Renewals) == 0 {
		return nil
	}
	r := h.Renewals[0].Renewal
	var reasons []string
	if !EqualJSON(r.Controller, s.Controller) {
		reasons = append(reasons, holdPath+" renewals controller must be the node session's controller")
	}
	if r.NodeID != s.NodeID {
		reasons = append(reasons, holdPath+" renewals nodeId must be the node session's nodeId")
	}
	if r.RuntimeNamespace != s.RuntimeNamespace {
		reasons = append(reasons, holdPath+" renewals runtimeNamespace must be the node session's runtimeNamespace")
	}
	return reasons
}

// ValidateHoldRuntimeNetworkDnsLeaseRenewalsRequest is validateHoldRuntimeNetworkDnsLeaseRenewalsRequest:
// every rule a relay can evaluate without a session or a clock — the reader's and the order —
// one reason per violation, empty for a valid request.
func ValidateHoldRuntimeNetworkDnsLeaseRenewalsRequest(raw []byte) []string {
	h, err := ReadHoldRuntimeNetworkDnsLeaseRenewalsRequest(raw)
	var invalid *InvalidError
	if errors.As(err, &invalid) {
		return invalid.Reasons
	}
	return h.OrderReasons()
}

func readProjectionReference(raw []byte, path string) (ProjectionReference, []string) {
	var id, generation, digest []byte
	if strictjson.ReadExact(raw, strictjson.Req("id", &id), strictjson.Req("generation", &generation), strictjson.Req("digest", &digest)) != nil {
		return ProjectionReference{}, []string{path + " must use its exact schema"}
	}
	var p ProjectionReference
	var reasons []string
	if s, err := strictjson.ReadString(id); err != nil || !IsCanonicalID(s) {
		reasons = append(reasons, path+" id must be a canonical identifier")
	} else {
		p.ID = s
	}
	if n, ok := strictjson.ReadCounter(generation); !ok {
		reasons = append(reasons, path+" generation must be a non-negative safe integer")
	} else {
		p.Generation = n
	}
	if s, err := strictjson.ReadString(digest); err != nil || !IsSha256Digest(s) {
		reasons = append(reasons, path+" digest must be a sha256 digest")
	} else {
		p.Digest = s
	}
	return p, reasons
}

func readSignedRenewal(raw []byte, path string) (SignedRuntimeNetworkDnsLeaseRenewal, []string) {
	var authority, renewal, signature []byte
	if strictjson.ReadExact(raw, strictjson.Req("authority", &authority), strictjson.Req("renewal", &renewal), strictjson.Req("signature", &signature)) != nil {
		return SignedRuntimeNetworkDnsLeaseRenewal{}, []string{path + " must use its exact schema"}
	}
	var reasons []string
	if !isOpaqueValue(authority) {
		reasons = append(reasons, path+" authority must be a JSON value other than null")
	}
	if !isOpaqueValue(signature) {
		reasons = append(reasons, path+" signature must be a JSON value other than null")
	}
	r, rr := readRenewal(renewal, path+" renewal")
	reasons = append(reasons, rr...)
	if len(reasons) > 0 {
		return SignedRuntimeNetworkDnsLeaseRenewal{}, reasons
	}
	return SignedRuntimeNetworkDnsLeaseRenewal{Authority: authority, Renewal: r, Signature: signature, Raw: raw}, nil
}

// isOpaqueValue: present, not null, and with a canonical form so that it compares as a value.
func isOpaqueValue(raw []byte) bool {
	if strictjson.IsNull(raw) {
		return false
	}
	_, err := strictjson.Canonicalize(raw)
	return err == nil
}

func readRenewal(raw []byte, path string) (RuntimeNetworkDnsLeaseRenewal, []string) {
	var controller, nodeID, namespace, projection, sequence, dns, digestRaw []byte
	if strictjson.ReadExact(raw, strictjson.Req("controller", &controller), strictjson.Req("nodeId", &nodeID), strictjson.Req("runtimeNamespace", &namespace),
		strictjson.Req("projection", &projection), strictjson.Req("sequence", &sequence), strictjson.Req("dns", &dns), strictjson.Req("digest", &digestRaw)) != nil {
		return RuntimeNetworkDnsLeaseRenewal{}, []string{path + " must use its exact schema"}
	}
	var r RuntimeNetworkDnsLeaseRenewal
	var reasons []string
	if strictjson.KindOf(controller) != strictjson.KindObject || !isOpaqueValue(controller) {
		reasons = append(reasons, path+" controller must be an object")
	} else {
		r.Controller = controller
	}
	if s, err := strictjson.ReadString(nodeID); err != nil || !IsClusterNodeID(s) {
		reasons = append(reasons, path+" nodeId must be a cluster node id")
	} else {
		r.NodeID = s
	}
	if s, err := strictjson.ReadString(namespace); err != nil || !IsCanonicalID(s) {
		reasons = append(reasons, path+" runtimeNamespace must be a canonical identifier")
	} else {
		r.RuntimeNamespace = s
	}
	p, pr := readProjectionReference(projection, path+" projection")
	reasons = append(reasons, pr...)
	r.Projection = p
	if n, ok := strictjson.ReadCounter(sequence); !ok {
		reasons = append(reasons, path+" sequence must be a non-negative safe integer")
	} else {
		r.Sequence = n
	}
	w, wr := readDnsWindow(dns, path+" dns")
	reasons = append(reasons, wr...)
	r.Dns = w
	digest, err := strictjson.ReadString(digestRaw)
	if err != nil || !IsSha256Digest(digest) {
		reasons = append(reasons, path+" digest must be a sha256 digest")
	} else if len(reasons) == 0 {
		// Digest only a renewal whose every member is valid: the digest covers them all.
		switch CheckRuntimeNetworkDnsLeaseRenewalDigest(raw, digest, RenewalDigestVerified) {
		case DigestInvalid:
			reasons = append(reasons, path+" digest must be the digest of the renewal")
		case DigestUnverified:
			r.DigestUnverified = true
		}
	}
	r.Digest = digest
	return r, reasons
}

func readDnsWindow(raw []byte, path string) (DnsWindow, []string) {
	var issuedAt, notBefore, expiresAt []byte
	if strictjson.ReadExact(raw, strictjson.Req("issuedAt", &issuedAt), strictjson.Req("notBefore", &notBefore), strictjson.Req("expiresAt", &expiresAt)) != nil {
		return DnsWindow{}, []string{path + " must use its exact schema"}
	}
	var w DnsWindow
	var reasons []string
	for _, f := range [...]struct {
		key string
		raw []byte
		dst *int64
	}{{"issuedAt", issuedAt, &w.IssuedAt}, {"notBefore", notBefore, &w.NotBefore}, {"expiresAt", expiresAt, &w.ExpiresAt}} {
		if n, ok := strictjson.ReadCounter(f.raw); ok {
			*f.dst = n
		} else {
			reasons = append(reasons, path+" "+f.key+" must be a non-negative safe integer (Unix ms)")
		}
	}
	if len(reasons) > 0 {
		return w, reasons
	}
	// The seeds' one rule on a window alone: "the fifteen-minute rule (maximumDnsLeaseMs, the same
	// limit a projection's window has) is measured from the slot" (issuedAt). Where notBefore lies
	// in it they leave to the node ("must not use a window before its notBefore"): a window that
	// opens before its slot, or never (notBefore >= expiresAt), is held and simply never current.
	if w.ExpiresAt-w.IssuedAt > MaximumDnsLeaseMs {
		reasons = append(reasons, path+" window must last at most "+strconv.Itoa(MaximumDnsLeaseMs)+" ms from issuedAt")
	}
	return w, reasons
}

// EncodeHoldRuntimeNetworkDnsLeaseRenewalsResponse is the answer { held }.
func EncodeHoldRuntimeNetworkDnsLeaseRenewalsResponse(held int) json.RawMessage {
	return append(strconv.AppendInt([]byte(`{"held":`), int64(held), 10), '}')
}

// BindHoldRuntimeNetworkDnsLeaseRenewalsResponse is bindHoldRuntimeNetworkDnsLeaseRenewalsResponse:
// the answer must be exactly { held } with held equal to the number of renewals sent.
func BindHoldRuntimeNetworkDnsLeaseRenewalsResponse(raw []byte, sent int) error {
	var held []byte
	if strictjson.ReadExact(raw, strictjson.Req("held", &held)) != nil {
		return &InvalidError{[]string{"hold answer must use its exact schema"}}
	}
	if n, ok := strictjson.ReadCounter(held); !ok || n != int64(sent) {
		return &InvalidError{[]string{"hold answer held must equal the number of renewals sent"}}
	}
	return nil
}

// AppendApplyRuntimeNetworkDnsLeaseRenewalRequest appends IApplyRuntimeNetworkDnsLeaseRenewalRequest
// { session, signed }: the node's own session binding and the signed envelope, both untouched.
func AppendApplyRuntimeNetworkDnsLeaseRenewalRequest(dst, session, signed []byte) []byte {
	dst = append(dst, `{"session":`...)
	dst = append(dst, session...)
	dst = append(dst, `,"signed":`...)
	dst = append(dst, signed...)
	return append(dst, '}')
}

// RuntimeNetworkDnsLeaseRenewalReference is IRuntimeNetworkDnsLeaseRenewalReference
// { projection, sequence, digest }.
type RuntimeNetworkDnsLeaseRenewalReference struct {
	Projection ProjectionReference
	Sequence   int64
	Digest     string
}

// BindApplyRuntimeNetworkDnsLeaseRenewalResponse is bindApplyRuntimeNetworkDnsLeaseRenewalResponse:
// the answer must be exactly { status, renewal }, status accepted or replay, and renewal the
// reference of the renewal that was sent (equal as JSON values). It returns the status.
func BindApplyRuntimeNetworkDnsLeaseRenewalResponse(raw []byte, sent RuntimeNetworkDnsLeaseRenewalReference) (string, error) {
	const path = "apply answer"
	var statusRaw, renewal []byte
	if strictjson.ReadExact(raw, strictjson.Req("status", &statusRaw), strictjson.Req("renewal", &renewal)) != nil {
		return "", &InvalidError{[]string{path + " must use its exact schema"}}
	}
	var reasons []string
	status, err := strictjson.ReadString(statusRaw)
	if err != nil || (status != ApplyStatusAccepted && status != ApplyStatusReplay) {
		reasons = append(reasons, path+" status must be accepted or replay")
	}
	var projection, sequence, digest []byte
	if strictjson.ReadExact(renewal, strictjson.Req("projection", &projection), strictjson.Req("sequence", &sequence), strictjson.Req("digest", &digest)) != nil {
		reasons = append(reasons, path+" renewal must use its exact schema")
		return "", &InvalidError{reasons}
	}
	if p, pr := readProjectionReference(projection, path+" renewal projection"); len(pr) > 0 || p != sent.Projection {
		reasons = append(reasons, path+" renewal projection must be the sent renewal's projection")
	}
	if n, ok := strictjson.ReadCounter(sequence); !ok || n != sent.Sequence {
		reasons = append(reasons, path+" renewal sequence must be the sent renewal's sequence")
	}
	if d, err := strictjson.ReadString(digest); err != nil || d != sent.Digest {
		reasons = append(reasons, path+" renewal digest must be the sent renewal's digest")
	}
	if len(reasons) > 0 {
		return "", &InvalidError{reasons}
	}
	return status, nil
}

// ReadSignedRuntimeNetworkDnsLeaseRenewal reads one ISignedRuntimeNetworkDnsLeaseRenewal
// { authority, renewal, signature } exactly, the renewal's digest included: what a node reads of
// applyRuntimeNetworkDnsLeaseRenewal's signed member before it admits it.
func ReadSignedRuntimeNetworkDnsLeaseRenewal(raw []byte) (SignedRuntimeNetworkDnsLeaseRenewal, error) {
	s, reasons := readSignedRenewal(raw, "signed renewal")
	if len(reasons) > 0 {
		return SignedRuntimeNetworkDnsLeaseRenewal{}, &InvalidError{reasons}
	}
	return s, nil
}
