package contracts

import (
	"encoding/json"
	"strconv"
	"time"
)

// The cluster ingress (SPEC §8, CONTRACTS §8): the registration an ingress sends through the
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

// Project-defined (OQ-16): capabilities is an optional, strictly ascending (so sorted and
// duplicate-free) array of at most MaxClusterIngressCapabilities names, each a lowercase token
// [a-z][a-z0-9-]{0,63}. The vocabulary is open: the relay forwards capabilities and never acts on
// one, so it must not refuse a name a newer ingress of the same major knows.
const MaxClusterIngressCapabilities = 32

// ClusterIngressRegistration is registerClusterIngress's request
// { bearer, version, nodeId, capabilities?, protocol }, as ReadClusterIngressRegistration read it.
// The bearer is a Secret: it prints as [secret] and is never marshaled.
type ClusterIngressRegistration struct {
	Bearer       Secret
	Version      string   // the ingress build: a release version (project-defined, OQ-16)
	NodeID       string   // the node the ingress runs on (node-id reader)
	Capabilities []string // nil when the key is absent
	Protocol     ProtocolOffer
}

// ValidateClusterIngressRegistration is validateClusterIngressRegistration: shape only (whether
// the bearer is the one Cloudly minted is Cloudly's to verify), exact keys, one reason per
// violation, empty for a valid body. path defaults to "cluster ingress registration". The
// messages are project-defined in the seed's style (the seed shows the validator's name, not its
// body); none quotes a value, so none can quote the bearer.
func ValidateClusterIngressRegistration(raw []byte, path string) []string {
	if path == "" {
		path = "cluster ingress registration"
	}
	members, err := ReadObject(raw)
	if err != nil || !hasExactKeys(members, "bearer", "version", "nodeId", "protocol", "?", "capabilities") {
		return []string{path + " must use its exact schema"}
	}
	m := byKey(members)
	var reasons []string
	if s, err := ReadString(m["bearer"]); err != nil || s == "" {
		reasons = append(reasons, path+" bearer must be a non-empty string")
	}
	if s, err := ReadString(m["version"]); err != nil || !IsReleaseVersion(s) {
		reasons = append(reasons, path+" version must be a release version")
	}
	if s, err := ReadString(m["nodeId"]); err != nil || !IsClusterNodeID(s) {
		reasons = append(reasons, path+" nodeId must be a cluster node id")
	}
	if c, ok := m["capabilities"]; ok {
		if _, ok := readCapabilities(c); !ok {
			reasons = append(reasons, path+" capabilities must be a sorted, duplicate-free array of at most 32 capability names")
		}
	}
	return append(reasons, ValidateProtocolOffer(m["protocol"], path+" protocol")...)
}

// ReadClusterIngressRegistration reads a registration the way the relay judges it: the offer is
// read first (ReadProtocolOffer), then the whole shape. Every failure is an *InvalidError whose
// reasons never quote the bearer.
func ReadClusterIngressRegistration(raw []byte) (ClusterIngressRegistration, error) {
	offer, err := ReadProtocolOffer(raw)
	if err != nil {
		return ClusterIngressRegistration{}, err
	}
	if reasons := ValidateClusterIngressRegistration(raw, ""); len(reasons) > 0 {
		return ClusterIngressRegistration{}, &InvalidError{Reasons: reasons}
	}
	members, _ := ReadObject(raw)
	m := byKey(members)
	bearer, _ := ReadString(m["bearer"])
	version, _ := ReadString(m["version"])
	node, _ := ReadString(m["nodeId"])
	r := ClusterIngressRegistration{Bearer: NewSecret(bearer), Version: version, NodeID: node, Protocol: offer}
	if c, ok := m["capabilities"]; ok {
		r.Capabilities, _ = readCapabilities(c)
	}
	return r, nil
}

// EncodeClusterIngressRegistration writes the request in the seed's key order. It is the one
// place the ingress's bearer is revealed, into the bytes sent to the relay.
func EncodeClusterIngressRegistration(r ClusterIngressRegistration) []byte {
	b := AppendString([]byte(`{"bearer":`), r.Bearer.Reveal())
	b = AppendString(append(b, `,"version":`...), r.Version)
	b = AppendString(append(b, `,"nodeId":`...), r.NodeID)
	if r.Capabilities != nil {
		b = append(b, `,"capabilities":[`...)
		for i, c := range r.Capabilities {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendString(b, c)
		}
		b = append(b, ']')
	}
	o, _ := r.Protocol.MarshalJSON()
	return append(append(append(b, `,"protocol":`...), o...), '}')
}

func readCapabilities(raw []byte) ([]string, bool) {
	elems, err := ReadArray(raw)
	if err != nil || len(elems) > MaxClusterIngressCapabilities {
		return nil, false
	}
	out := make([]string, 0, len(elems))
	for i, e := range elems {
		s, err := ReadString(e)
		if err != nil || !isCapabilityName(s) || i > 0 && s <= out[i-1] {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

func isCapabilityName(s string) bool {
	if len(s) == 0 || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// ReadClusterIngressRegistrationAcceptance reads Cloudly's accepted answer
// { accepted: true, revision | null, protocol } far enough to know it is an acceptance: an object
// whose accepted member is the literal true. The rest stays opaque and is forwarded untouched.
func ReadClusterIngressRegistrationAcceptance(raw []byte) bool {
	v, ok, err := Lookup(raw, "accepted")
	if err != nil || !ok {
		return false
	}
	accepted, ok := ReadBool(v)
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
	members, err := ReadObject(raw)
	if err != nil || !hasExactKeys(members, "code", "reason", "retryAfterMs") {
		return []string{path + " must use its exact schema"}
	}
	m := byKey(members)
	var reasons []string
	if s, err := ReadString(m["code"]); err != nil || s != ClusterIngressRegistrationRefusedCode {
		reasons = append(reasons, path+" code must be "+ClusterIngressRegistrationRefusedCode)
	}
	if s, err := ReadString(m["reason"]); err != nil || !IsClusterIngressRegistrationRefusalReason(s) {
		reasons = append(reasons, path+" reason must be a cluster ingress registration refusal reason")
	}
	if n, ok := ReadSafeInteger(m["retryAfterMs"]); !ok || n < ClusterIngressMinimumRetryAfterMs || n > ClusterIngressMaximumRetryAfterMs {
		reasons = append(reasons, path+" retryAfterMs must be an integer from "+
			strconv.Itoa(ClusterIngressMinimumRetryAfterMs)+" to "+strconv.Itoa(ClusterIngressMaximumRetryAfterMs))
	}
	return reasons
}

// ReadClusterIngressRegistrationRefusal is readClusterIngressRegistrationRefusal: the refusal
// inside an error's data, or ok == false when the value is not one.
func ReadClusterIngressRegistrationRefusal(raw []byte) (ClusterIngressRegistrationRefusal, bool) {
	if len(ValidateClusterIngressRegistrationRefusal(raw, "")) > 0 {
		return ClusterIngressRegistrationRefusal{}, false
	}
	members, _ := ReadObject(raw)
	m := byKey(members)
	reason, _ := ReadString(m["reason"])
	retry, _ := ReadSafeInteger(m["retryAfterMs"])
	return ClusterIngressRegistrationRefusal{Code: ClusterIngressRegistrationRefusedCode, Reason: reason, RetryAfterMs: retry}, true
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
	b := AppendString([]byte(`{"code":`), r.Code)
	b = AppendString(append(b, `,"reason":`...), r.Reason)
	b = strconv.AppendInt(append(b, `,"retryAfterMs":`...), r.RetryAfterMs, 10)
	return append(b, '}')
}

// Text is the error text a refusal travels with: "cluster-ingress-registration-refused: <reason>"
// (project-defined, the relay's "<name>: <reason>" carriage).
func (r ClusterIngressRegistrationRefusal) Text() string { return r.Code + ": " + r.Reason }

// RetryAfter is retryAfterMs as a duration.
func (r ClusterIngressRegistrationRefusal) RetryAfter() time.Duration {
	return time.Duration(r.RetryAfterMs) * time.Millisecond
}

// --- IClusterIngressRouteTableChange ----------------------------------------------------------

// ValidateClusterIngressRouteTableChange is validateClusterIngressRouteTableChange with the seed's
// exact messages. path defaults to "cluster ingress route table change". The hint carries the
// revision alone and is safe to log.
func ValidateClusterIngressRouteTableChange(raw []byte, path string) []string {
	if path == "" {
		path = "cluster ingress route table change"
	}
	members, err := ReadObject(raw)
	if err != nil || !hasExactKeys(members, "revision") {
		return []string{path + " must use its exact schema"}
	}
	if _, ok := ReadCounter(members[0].Value); !ok {
		return []string{path + " revision must be a non-negative safe integer"}
	}
	return nil
}

// ReadClusterIngressRouteTableChange reads a hint's revision, or ok == false.
func ReadClusterIngressRouteTableChange(raw []byte) (revision int64, ok bool) {
	if len(ValidateClusterIngressRouteTableChange(raw, "")) > 0 {
		return 0, false
	}
	members, _ := ReadObject(raw)
	return ReadCounter(members[0].Value)
}

// EncodeClusterIngressRouteTableChange writes the hint { revision }.
func EncodeClusterIngressRouteTableChange(revision int64) []byte {
	return append(strconv.AppendInt([]byte(`{"revision":`), revision, 10), '}')
}

// --- Route tables -----------------------------------------------------------------------------

// RouteTable is a cluster route table as the relay reads it: table.revision alone. Raw is the
// whole table exactly as received (certificates and keys included: never log it, never write it
// anywhere). A nil Raw is the null table: Cloudly has computed none yet — a fact, not an empty
// table.
type RouteTable struct {
	Raw      json.RawMessage
	Revision int64
}

// IsNull reports whether t is the null table.
func (t RouteTable) IsNull() bool { return t.Raw == nil }

// ReadRouteTable reads a table value: null, or an object whose revision is a non-negative safe
// integer (the one member the relay reads; project-defined where the revision lives, OQ-14).
func ReadRouteTable(raw []byte, path string) (RouteTable, error) {
	if IsNull(raw) {
		return RouteTable{}, nil
	}
	if KindOf(raw) != KindObject {
		return RouteTable{}, &InvalidError{[]string{path + " must be null or an object"}}
	}
	rev, ok, err := Lookup(raw, "revision")
	if err != nil {
		return RouteTable{}, &InvalidError{[]string{path + " must be null or an object"}}
	}
	n, isCounter := ReadCounter(rev)
	if !ok || !isCounter {
		return RouteTable{}, &InvalidError{[]string{path + " revision must be a non-negative safe integer"}}
	}
	return RouteTable{Raw: trimSpace(raw), Revision: n}, nil
}

// readTableCarrier reads a body { table } with exactly that key.
func readTableCarrier(body []byte, path string) (RouteTable, error) {
	members, err := ReadObject(body)
	if err != nil || !hasExactKeys(members, "table") {
		return RouteTable{}, &InvalidError{[]string{path + " must use its exact schema"}}
	}
	return ReadRouteTable(members[0].Value, path+" table")
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
	members, err := ReadObject(body)
	if err != nil || !hasExactKeys(members, "knownRevision") {
		return 0, &InvalidError{[]string{path + " must use its exact schema"}}
	}
	if IsNull(members[0].Value) {
		return -1, nil
	}
	n, ok := ReadCounter(members[0].Value)
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
