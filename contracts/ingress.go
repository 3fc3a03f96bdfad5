package contracts

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"strconv"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// The cluster ingress (docs/protocol.md#cluster-ingress): the registration an ingress sends through the
// relay, Cloudly's named refusal of it, the route table the relay holds and serves, the change
// hint, and the traffic statistics pages. Seed-defined unless marked project-defined; the
// project-defined choices are recorded in docs/decisions.md under "Ingress".

// ClusterIngressEnvironment is clusterIngressEnvironmentNames: the environment variable names of
// the cluster ingress workload. Cloudly writes them; the ingress reads them. Bearer names a secret.
type ClusterIngressEnvironment struct {
	Bearer      string // the registration bearer, delivered as a secret
	RelayOrigin string // the exact IClusterRelay.origin of the cluster's relay
	NodeID      string // the node the assignment runs on, which the registration's nodeId repeats
}

var clusterIngressEnvironmentNames = ClusterIngressEnvironment{
	Bearer:      "SERVEZONE_CLUSTER_INGRESS_BEARER",
	RelayOrigin: "SERVEZONE_CLUSTER_RELAY_ORIGIN",
	NodeID:      "SERVEZONE_CLUSTER_NODE_ID",
}

// ClusterIngressEnvironmentNames is clusterIngressEnvironmentNames (a copy: the names are frozen).
func ClusterIngressEnvironmentNames() ClusterIngressEnvironment {
	return clusterIngressEnvironmentNames
}

// --- registerClusterIngress -------------------------------------------------------------------

// ClusterIngressRegistration is registerClusterIngress's request
// { bearer, version, nodeId, capabilities?, protocol }, as ReadClusterIngressRegistration read it.
// The bearer is a Secret: it prints as [secret] and is never marshaled.
type ClusterIngressRegistration struct {
	Bearer       Secret
	Version      string   // the ingress build, as it states it (the seeds give no grammar)
	NodeID       string   // the node the ingress runs on (node-id reader)
	Capabilities []string // nil when the key is absent
	Protocol     ProtocolOffer
}

// ValidateClusterIngressRegistration is validateClusterIngressRegistration: shape only (whether
// the bearer is the one Cloudly minted is Cloudly's to verify), exact keys, one reason per
// violation, empty for a valid body. path defaults to "cluster ingress registration". The seeds
// spell the keys ({ bearer, version, nodeId, capabilities?, protocol }), the node id rule
// (isClusterNodeId at every node-bearing member, an ingress registration's among them) and the
// offer, and no grammar for bearer, version or capabilities: those are read as strings and an
// array of strings and judged no further (the relay forwards them and acts on none). The messages
// are project-defined in the seed's style; none quotes a value, so none can quote the bearer.
func ValidateClusterIngressRegistration(raw []byte, path string) []string {
	if path == "" {
		path = "cluster ingress registration"
	}
	_, reasons := readClusterIngressRegistration(raw, path)
	return reasons
}

// ReadClusterIngressRegistration reads a registration with ValidateClusterIngressRegistration's
// rules, in one pass. The relay reads and negotiates the offer first (ReadProtocolOffer, docs/protocol.md#protocol-handshake
// judging order) and calls this only then. Every failure is an *InvalidError whose reasons never
// quote the bearer.
func ReadClusterIngressRegistration(raw []byte) (ClusterIngressRegistration, error) {
	r, reasons := readClusterIngressRegistration(raw, "cluster ingress registration")
	if len(reasons) > 0 {
		return ClusterIngressRegistration{}, &InvalidError{Reasons: reasons}
	}
	return r, nil
}

func readClusterIngressRegistration(raw []byte, path string) (ClusterIngressRegistration, []string) {
	var bearer, version, nodeID, protocol, capabilities []byte
	if strictjson.ReadExact(raw, strictjson.Req("bearer", &bearer), strictjson.Req("version", &version), strictjson.Req("nodeId", &nodeID),
		strictjson.Req("protocol", &protocol), strictjson.Opt("capabilities", &capabilities)) != nil {
		return ClusterIngressRegistration{}, []string{path + " must use its exact schema"}
	}
	var r ClusterIngressRegistration
	var reasons []string
	if s, err := strictjson.ReadString(bearer); err != nil {
		reasons = append(reasons, path+" bearer must be a string")
	} else {
		r.Bearer = NewSecret(s)
	}
	if s, err := strictjson.ReadString(version); err != nil {
		reasons = append(reasons, path+" version must be a string")
	} else {
		r.Version = s
	}
	if s, err := strictjson.ReadString(nodeID); err != nil || !IsClusterNodeID(s) {
		reasons = append(reasons, path+" nodeId must be a cluster node id")
	} else {
		r.NodeID = s
	}
	if capabilities != nil {
		var ok bool
		if r.Capabilities, ok = readCapabilities(capabilities); !ok {
			reasons = append(reasons, path+" capabilities must be an array of strings")
		}
	}
	var offerReasons []string
	r.Protocol, offerReasons = readProtocolOffer(protocol, path+" protocol")
	return r, append(reasons, offerReasons...)
}

// EncodeClusterIngressRegistration writes the request in the seed's key order. It is the one
// place the ingress's bearer is revealed, into the bytes sent to the relay.
func EncodeClusterIngressRegistration(r ClusterIngressRegistration) []byte {
	b := strictjson.AppendString([]byte(`{"bearer":`), r.Bearer.Reveal())
	b = strictjson.AppendString(append(b, `,"version":`...), r.Version)
	b = strictjson.AppendString(append(b, `,"nodeId":`...), r.NodeID)
	if r.Capabilities != nil {
		b = append(b, `,"capabilities":[`...)
		for i, c := range r.Capabilities {
			if i > 0 {
				b = append(b, ',')
			}
			b = strictjson.AppendString(b, c)
		}
		b = append(b, ']')
	}
	o, _ := r.Protocol.MarshalJSON()
	return append(append(append(b, `,"protocol":`...), o...), '}')
}

func readCapabilities(raw []byte) ([]string, bool) {
	elems, err := strictjson.ReadArray(raw)
	if err != nil {
		return nil, false
	}
	out := make([]string, 0, len(elems))
	for _, e := range elems {
		s, err := strictjson.ReadString(e)
		if err != nil {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

// ReadClusterIngressRegistrationAcceptance reads Cloudly's accepted answer
// { accepted: true, revision | null, protocol } far enough to know it is an acceptance: an object
// whose accepted member is the literal true. The rest stays opaque and is forwarded untouched.
func ReadClusterIngressRegistrationAcceptance(raw []byte) bool {
	v, ok, err := strictjson.Lookup(raw, "accepted")
	if err != nil || !ok {
		return false
	}
	accepted, ok := strictjson.ReadBool(v)
	return ok && accepted
}

// --- IClusterIngressRegistrationRefusal -------------------------------------------------------

// ClusterIngressRegistrationRefusal is IClusterIngressRegistrationRefusal, Cloudly's named refusal
// of a registration, carried as the error's data and forwarded by the relay untouched. It never
// quotes the bearer.
type ClusterIngressRegistrationRefusal struct {
	Code         string // always ClusterIngressRegistrationRefusedCode
	Reason       string // one of ClusterIngressRegistrationRefusalReasons
	RetryAfterMs int64  // 1 000 to 300 000
}

// ValidateClusterIngressRegistrationRefusal is validateClusterIngressRegistrationRefusal with the
// seed's exact messages. path defaults to "cluster ingress registration refusal".
func ValidateClusterIngressRegistrationRefusal(raw []byte, path string) []string {
	if path == "" {
		path = "cluster ingress registration refusal"
	}
	_, reasons := readClusterIngressRegistrationRefusal(raw, path)
	return reasons
}

func readClusterIngressRegistrationRefusal(raw []byte, path string) (ClusterIngressRegistrationRefusal, []string) {
	var code, reason, retryAfter []byte
	if strictjson.ReadExact(raw, strictjson.Req("code", &code), strictjson.Req("reason", &reason), strictjson.Req("retryAfterMs", &retryAfter)) != nil {
		return ClusterIngressRegistrationRefusal{}, []string{path + " must use its exact schema"}
	}
	r := ClusterIngressRegistrationRefusal{Code: ClusterIngressRegistrationRefusedCode}
	var reasons []string
	if s, err := strictjson.ReadString(code); err != nil || s != ClusterIngressRegistrationRefusedCode {
		reasons = append(reasons, path+" code must be "+ClusterIngressRegistrationRefusedCode)
	}
	if s, err := strictjson.ReadString(reason); err != nil || !IsClusterIngressRegistrationRefusalReason(s) {
		reasons = append(reasons, path+" reason must be a cluster ingress registration refusal reason")
	} else {
		r.Reason = s
	}
	if n, ok := strictjson.ReadSafeInteger(retryAfter); !ok || n < ClusterIngressMinimumRetryAfterMs || n > ClusterIngressMaximumRetryAfterMs {
		reasons = append(reasons, path+" retryAfterMs must be an integer from "+
			strconv.Itoa(ClusterIngressMinimumRetryAfterMs)+" to "+strconv.Itoa(ClusterIngressMaximumRetryAfterMs))
	} else {
		r.RetryAfterMs = n
	}
	return r, reasons
}

// ReadClusterIngressRegistrationRefusal is readClusterIngressRegistrationRefusal: the refusal
// inside an error's data, or ok == false when the value is not one.
func ReadClusterIngressRegistrationRefusal(raw []byte) (ClusterIngressRegistrationRefusal, bool) {
	r, reasons := readClusterIngressRegistrationRefusal(raw, "cluster ingress registration refusal")
	if len(reasons) > 0 {
		return ClusterIngressRegistrationRefusal{}, false
	}
	return r, true
}

// IsClusterIngressRegistrationRefusalReason reports whether s is one of the eight reasons.
func IsClusterIngressRegistrationRefusalReason(s string) bool {
	for _, r := range clusterIngressRegistrationRefusalReasons {
		if r == s {
			return true
		}
	}
	return false
}

// Data is the refusal as the error data it travels as, in the seed's key order.
func (r ClusterIngressRegistrationRefusal) Data() json.RawMessage {
	b := strictjson.AppendString([]byte(`{"code":`), r.Code)
	b = strictjson.AppendString(append(b, `,"reason":`...), r.Reason)
	b = strconv.AppendInt(append(b, `,"retryAfterMs":`...), r.RetryAfterMs, 10)
	return append(b, '}')
}

// Text is the error text a refusal travels with: "cluster-ingress-registration-refused: <reason>"
// (project-defined, the relay's "<name>: <reason>" carriage).
func (r ClusterIngressRegistrationRefusal) Text() string { return r.Code + ": " + r.Reason }

// The reasons of the relay's own ingress registration refusals (seed-defined names).
const (
	// IngressRefusedNotReady: "Cloudly cannot judge registrations yet" — as the ingress sees it,
	// nobody can now: the relay is detached, standing by, shutting down or full.
	IngressRefusedNotReady = "not-ready"
	// IngressRefusedRegistrationInvalid: "The body fails validateClusterIngressRegistration",
	// judged by the relay before it asks Cloudly.
	IngressRefusedRegistrationInvalid = "registration-invalid"
)

// IngressRegistrationRefusal gives cause, a refusal the relay makes itself of a registerClusterIngress,
// the shape the seeds give every registration refusal but the protocol's ("every other refusal
// travels as IClusterIngressRegistrationRefusal { code: 'cluster-ingress-registration-refused',
// reason, retryAfterMs } in TypedResponseError.errorData"), so that an ingress that knows only the
// seeds reads it and waits retryAfterMs, clamped to 1 000 – 300 000, before it registers again.
// The error text stays the relay's own "<name>: <reason>" (relay-upstream-detached: …) and the
// name stays cause's for errors.Is and metrics on this side; the relay's cause is never put into
// the seed's reason enum. reason must be one of ClusterIngressRegistrationRefusalReasons.
func IngressRegistrationRefusal(reason string, cause *Refusal, retryAfterMs int64) *Refusal {
	r := ClusterIngressRegistrationRefusal{Code: ClusterIngressRegistrationRefusedCode, Reason: reason,
		RetryAfterMs: min(max(retryAfterMs, ClusterIngressMinimumRetryAfterMs), ClusterIngressMaximumRetryAfterMs)}
	out := *cause
	out.data = r.Data()
	return &out
}

// --- IClusterIngressRouteTableChange ----------------------------------------------------------

// ValidateClusterIngressRouteTableChange is validateClusterIngressRouteTableChange with the seed's
// exact messages. path defaults to "cluster ingress route table change". The hint carries the
// revision alone and is safe to log.
func ValidateClusterIngressRouteTableChange(raw []byte, path string) []string {
	if path == "" {
		path = "cluster ingress route table change"
	}
	_, reasons := readClusterIngressRouteTableChange(raw, path)
	return reasons
}

func readClusterIngressRouteTableChange(raw []byte, path string) (int64, []string) {
	var revision []byte
	if strictjson.ReadExact(raw, strictjson.Req("revision", &revision)) != nil {
		return 0, []string{path + " must use its exact schema"}
	}
	n, ok := strictjson.ReadCounter(revision)
	if !ok {
		return 0, []string{path + " revision must be a non-negative safe integer"}
	}
	return n, nil
}

// ReadClusterIngressRouteTableChange reads a hint's revision, or ok == false.
func ReadClusterIngressRouteTableChange(raw []byte) (revision int64, ok bool) {
	n, reasons := readClusterIngressRouteTableChange(raw, "cluster ingress route table change")
	return n, len(reasons) == 0
}

// EncodeClusterIngressRouteTableChange writes the hint { revision }.
func EncodeClusterIngressRouteTableChange(revision int64) []byte {
	return append(strconv.AppendInt([]byte(`{"revision":`), revision, 10), '}')
}

// --- Route tables -----------------------------------------------------------------------------

// RouteTable is a cluster route table as the relay reads it: its revision alone. Raw is the whole
// table exactly as received (certificates and keys included: never log it, never write it
// anywhere). A nil Raw is the null table: Cloudly has computed none yet — a fact, not an empty
// table.
type RouteTable struct {
	Raw      json.RawMessage
	Revision int64
	// Derived is set when the table states no revision (no revision member that is a
	// non-negative safe integer): Revision is then DeriveRouteTableRevision of its bytes, which
	// tells tables apart but does not order them.
	Derived bool
}

// IsNull reports whether t is the null table.
func (t RouteTable) IsNull() bool { return t.Raw == nil }

// ReadRouteTable reads a table value tolerantly (where the revision lives is this project's
// guess). raw is one well-formed JSON value, as the readers of its carriers hand it out.
// null is the null table; any other JSON value is a table, served untouched. Its
// revision is table.revision when that is a non-negative safe integer; otherwise the table is
// still served and its revision is derived from its bytes (Derived). The relay reads nothing
// else of a table.
func ReadRouteTable(raw []byte, path string) (RouteTable, error) {
	if strictjson.IsNull(raw) {
		return RouteTable{}, nil
	}
	raw = strictjson.TrimSpace(raw)
	if strictjson.KindOf(raw) == strictjson.KindObject {
		var revision []byte
		if strictjson.ReadTolerant(raw, strictjson.Opt("revision", &revision)) != nil {
			return RouteTable{}, &InvalidError{[]string{path + " must not repeat its revision"}}
		}
		if n, ok := strictjson.ReadCounter(revision); ok {
			return RouteTable{Raw: raw, Revision: n}, nil
		}
	}
	return RouteTable{Raw: raw, Revision: DeriveRouteTableRevision(raw), Derived: true}, nil
}

// DeriveRouteTableRevision is the revision of a table that states none (project-defined): the
// first 53 bits of the SHA-256 of its bytes, so that it is a non-negative safe integer like every
// revision on the wire. Equal bytes give equal revisions; different bytes, different ones but for
// a 2^-53 chance.
func DeriveRouteTableRevision(raw []byte) int64 {
	sum := sha256.Sum256(raw)
	return int64(binary.BigEndian.Uint64(sum[:8]) >> 11)
}

// readTableCarrier reads a body { table } with exactly that key (seed-spelled).
func readTableCarrier(body []byte, path string) (RouteTable, error) {
	var table []byte
	if strictjson.ReadExact(body, strictjson.Req("table", &table)) != nil {
		return RouteTable{}, &InvalidError{[]string{path + " must use its exact schema"}}
	}
	return ReadRouteTable(table, path+" table")
}

// ReadPushClusterRouteTableRequest reads pushClusterRouteTable's request { table } (Cloudly →
// relay). Path "cluster route table push".
func ReadPushClusterRouteTableRequest(body []byte) (RouteTable, error) {
	return readTableCarrier(body, "cluster route table push")
}

// ReadGetClusterRouteTableResponse reads getClusterRouteTable's answer { table | null } (Cloudly
// → relay). Path "cluster route table answer".
func ReadGetClusterRouteTableResponse(body []byte) (RouteTable, error) {
	return readTableCarrier(body, "cluster route table answer")
}

// ReadGetClusterIngressRouteTableResponse reads getClusterIngressRouteTable's answer
// { table | null } (relay → ingress). Path "cluster ingress route table answer".
func ReadGetClusterIngressRouteTableResponse(body []byte) (RouteTable, error) {
	return readTableCarrier(body, "cluster ingress route table answer")
}

// EncodeRouteTableAnswer writes { table } for t: the table's bytes untouched, or null.
func EncodeRouteTableAnswer(t RouteTable) []byte {
	b := make([]byte, 0, len(t.Raw)+12)
	b = append(b, `{"table":`...)
	if t.IsNull() {
		b = append(b, "null"...)
	} else {
		b = append(b, t.Raw...)
	}
	return append(b, '}')
}

// EncodeAppliedRevision writes pushClusterRouteTable's answer { appliedRevision }: the revision
// the relay holds after the push, null while it holds the null table.
func EncodeAppliedRevision(t RouteTable) []byte {
	if t.IsNull() {
		return []byte(`{"appliedRevision":null}`)
	}
	return append(strconv.AppendInt([]byte(`{"appliedRevision":`), t.Revision, 10), '}')
}

// ReadGetClusterIngressRouteTableRequest reads getClusterIngressRouteTable's request
// { knownRevision | null }. known is -1 for null. Path "cluster ingress route table request".
func ReadGetClusterIngressRouteTableRequest(body []byte) (known int64, err error) {
	const path = "cluster ingress route table request"
	var knownRevision []byte
	if strictjson.ReadExact(body, strictjson.Req("knownRevision", &knownRevision)) != nil {
		return 0, &InvalidError{[]string{path + " must use its exact schema"}}
	}
	if strictjson.IsNull(knownRevision) {
		return -1, nil
	}
	n, ok := strictjson.ReadCounter(knownRevision)
	if !ok {
		return 0, &InvalidError{[]string{path + " knownRevision must be null or a non-negative safe integer"}}
	}
	return n, nil
}

// EncodeGetClusterIngressRouteTableRequest writes { knownRevision }; known < 0 is null.
func EncodeGetClusterIngressRouteTableRequest(known int64) []byte {
	if known < 0 {
		return []byte(`{"knownRevision":null}`)
	}
	return append(strconv.AppendInt([]byte(`{"knownRevision":`), known, 10), '}')
}
