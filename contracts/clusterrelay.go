package contracts

import (
	"encoding/json"
	"net/netip"
	"strconv"
	"strings"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// The relay's own session with Cloudly: its registration, the cluster relay block and the
// configuration Cloudly pushes (docs/protocol.md#upstream-session).

// Methods of the relay's own session with Cloudly.
const (
	MethodRegisterCloudlyClientSession = "registerCloudlyClientSession" // relay → Cloudly (seed)
	MethodRegisterClusterRelay         = "registerClusterRelay"         // relay → Cloudly (seed)
	MethodRegisterClusterVpnHub        = "registerClusterVpnHub"        // relay → Cloudly (project)
	MethodPushClusterRelayConfig       = "pushClusterRelayConfig"       // Cloudly → relay (project)
	MethodPushRelayUpstreamChanged     = "pushRelayUpstreamChanged"     // relay → downstream (project)
)

// IsCanonicalOrigin reports whether s is an origin of the given scheme ("https" or "http") that
// the WHATWG URL parser would serialize unchanged: new URL(s).origin === s. That means no path,
// query, fragment, userinfo or trailing slash, a lowercase host, and no default port.
func IsCanonicalOrigin(s, scheme string) bool {
	rest, ok := strings.CutPrefix(s, scheme+"://")
	if !ok || rest == "" || strings.ContainsAny(rest, "/?#@\\ ") {
		return false
	}
	host, port := rest, ""
	if strings.HasPrefix(rest, "[") {
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			return false
		}
		a, err := netip.ParseAddr(rest[1:end])
		if err != nil || !a.Is6() || a.Zone() != "" || whatwgIPv6(a) != rest[1:end] {
			return false
		}
		host, rest = rest[:end+1], rest[end+1:]
		if rest != "" {
			if rest[0] != ':' {
				return false
			}
			port = rest[1:]
		}
	} else if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		host, port = rest[:i], rest[i+1:]
	}
	if port != "" || strings.HasSuffix(s, ":") {
		if port == "" || (len(port) > 1 && port[0] == '0') || len(port) > 5 {
			return false
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 0 || n > 65535 || strconv.Itoa(n) != port {
			return false // the parser keeps port 0, and refuses what is above 65535
		}
		if (scheme == "https" && n == 443) || (scheme == "http" && n == 80) {
			return false
		}
	}
	if strings.HasPrefix(host, "[") {
		return true
	}
	return isCanonicalHostname(host)
}

// isCanonicalHostname reports whether the WHATWG URL parser keeps host (no brackets) as it is: the
// seed's only rule for a host is "new URL(origin).origin === origin", and the parser checks no DNS
// syntax (no label length, no hyphen or underscore rule, empty labels kept). So: printable ASCII
// (anything else is rewritten to punycode or percent-escapes), no upper case (lowercased), no
// forbidden domain code point (the parser fails), and a host that ends in a number (its last label,
// a trailing dot aside, all digits or 0x and hex) is IPv4, kept only as a dotted quad without a
// trailing dot. An xn-- label is taken as it is, not decoded: the parser refuses a few such labels
// the relay accepts, which no Cloudly that validated its origin sends.
func isCanonicalHostname(host string) bool {
	if host == "" {
		return false
	}
	for i := 0; i < len(host); i++ {
		if c := host[i]; c <= ' ' || c >= 0x7f || c >= 'A' && c <= 'Z' || strings.IndexByte(forbiddenDomainCodePoints, c) >= 0 {
			return false
		}
	}
	labels := strings.Split(host, ".")
	last := labels[len(labels)-1]
	if last == "" && len(labels) > 1 {
		last = labels[len(labels)-2]
	}
	if endsInNumber(last) {
		a, err := netip.ParseAddr(host)
		return err == nil && a.Is4() && a.String() == host
	}
	return true
}

// forbiddenDomainCodePoints are the printable ASCII forbidden domain code points of the WHATWG URL
// standard (the controls, space and DEL are refused before).
const forbiddenDomainCodePoints = "#%/:<>?@[\\]^|"

// endsInNumber is the WHATWG "ends in a number" test of a host's last label: ASCII digits, or 0x
// (0X) and hex digits.
func endsInNumber(label string) bool {
	digits, hex := label, false
	if len(label) >= 2 && label[0] == '0' && label[1]|0x20 == 'x' {
		digits, hex = label[2:], true
	}
	if digits == "" {
		return hex
	}
	for i := 0; i < len(digits); i++ {
		c := digits[i]
		if !(c >= '0' && c <= '9' || hex && (c|0x20 >= 'a' && c|0x20 <= 'f')) {
			return false
		}
	}
	return true
}

// whatwgIPv6 serializes an IPv6 address as the WHATWG URL parser does: eight hex pieces without
// leading zeros, the first longest run of two or more zero pieces written "::", and never a dotted
// IPv4 tail (netip writes ::ffff:1.2.3.4; URL writes ::ffff:102:304).
func whatwgIPv6(a netip.Addr) string {
	b := a.As16()
	var pieces [8]uint16
	for i := range pieces {
		pieces[i] = uint16(b[2*i])<<8 | uint16(b[2*i+1])
	}
	start, length := -1, 1
	for i := 0; i < 8; {
		j := i
		for j < 8 && pieces[j] == 0 {
			j++
		}
		if j-i > length {
			start, length = i, j-i
		}
		if j == i {
			j++
		}
		i = j
	}
	var s []byte
	for i := 0; i < 8; i++ {
		if i == start {
			s = append(s, ':', ':')
			i += length - 1
			continue
		}
		if len(s) > 0 && s[len(s)-1] != ':' {
			s = append(s, ':')
		}
		s = strconv.AppendUint(s, uint64(pieces[i]), 16)
	}
	return string(s)
}

// ClusterRelay is IClusterRelay { origin }, the cluster's relay block.
type ClusterRelay struct {
	Origin string `json:"origin"`
}

// ValidateClusterRelay is validateClusterRelay: one reason per violation, empty for a valid block.
// path defaults to "cluster relay".
func ValidateClusterRelay(raw []byte, path string) []string {
	if path == "" {
		path = "cluster relay"
	}
	_, reasons := readClusterRelay(raw, path)
	return reasons
}

// readClusterRelay reads an IClusterRelay block exactly, as validateClusterRelay does.
func readClusterRelay(raw []byte, path string) (ClusterRelay, []string) {
	var origin []byte
	if strictjson.ReadExact(raw, strictjson.Req("origin", &origin)) != nil {
		return ClusterRelay{}, []string{path + " must use its exact schema"}
	}
	s, err := strictjson.ReadString(origin)
	if err != nil || !IsCanonicalOrigin(s, "https") {
		return ClusterRelay{}, []string{path + " origin must be a canonical https origin"}
	}
	return ClusterRelay{Origin: s}, nil
}

// ClusterRelayCertificateDomainName is clusterRelayCertificateDomainName: the origin's host, the
// name Cloudly issues the relay's certificate for.
func ClusterRelayCertificateDomainName(r ClusterRelay) string {
	host := strings.TrimPrefix(r.Origin, "https://")
	if strings.HasPrefix(host, "[") {
		return host[:strings.IndexByte(host, ']')+1]
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		return host[:i]
	}
	return host
}

// VPNHubEndpoint is what the relay's VPN hub bound and the static Noise public key it answers
// with (32 bytes, base64url without padding): what the relay reports with registerClusterVpnHub.
// It is no wire shape of its own (ClusterVpnHubReport is).
type VPNHubEndpoint struct {
	Address        string
	QUICPort       int
	NoisePublicKey string
}

// ClusterRelayRegistration is IRegisterClusterRelayRequest.relay: the seed's four members and no
// other (docs/protocol.md#attaching, changed 2026-12-01: the seed's validators are exact-key, so any member it
// does not spell gets the whole registration refused). Version is the relay build, a different
// fact from the protocol offer's interfacesVersion.
type ClusterRelayRegistration struct {
	Version       string `json:"version"`
	NodeID        string `json:"nodeId"`
	ListenAddress string `json:"listenAddress"`
	ListenPort    int    `json:"listenPort"`
}

// RegisterClusterRelayRequest is IRegisterClusterRelayRequest.
type RegisterClusterRelayRequest struct {
	Protocol             ProtocolOffer            `json:"protocol"`
	Relay                ClusterRelayRegistration `json:"relay"`
	RegistrationSequence int64                    `json:"registrationSequence"`
}

// ValidateRegisterClusterRelayRequest is validateRegisterClusterRelayRequest: exact-key at every
// level, shape only, one reason per violation. path defaults to "cluster relay registration".
func ValidateRegisterClusterRelayRequest(raw []byte, path string) []string {
	if path == "" {
		path = "cluster relay registration"
	}
	var protocol, relay, sequence []byte
	if strictjson.ReadExact(raw, strictjson.Req("protocol", &protocol), strictjson.Req("relay", &relay), strictjson.Req("registrationSequence", &sequence)) != nil {
		return []string{path + " must use its exact schema"}
	}
	reasons := ValidateProtocolOffer(protocol, path+" protocol")
	reasons = append(reasons, validateRelayBlock(relay, path+" relay")...)
	if _, ok := strictjson.ReadCounter(sequence); !ok {
		reasons = append(reasons, path+" registrationSequence must be a non-negative safe integer")
	}
	return reasons
}

func validateRelayBlock(raw []byte, path string) []string {
	var version, nodeID, address, port []byte
	if strictjson.ReadExact(raw, strictjson.Req("version", &version), strictjson.Req("nodeId", &nodeID), strictjson.Req("listenAddress", &address),
		strictjson.Req("listenPort", &port)) != nil {
		return []string{path + " must use its exact schema"}
	}
	var reasons []string
	if s, err := strictjson.ReadString(version); err != nil || !IsReleaseVersion(s) {
		reasons = append(reasons, path+" version must be a release version")
	}
	if s, err := strictjson.ReadString(nodeID); err != nil || !IsClusterNodeID(s) {
		reasons = append(reasons, path+" nodeId must be a cluster node id")
	}
	if s, err := strictjson.ReadString(address); err != nil || !IsPlausibleUnicastIPv4(s) {
		reasons = append(reasons, path+" listenAddress must be a unicast IPv4 literal that is neither loopback nor link-local")
	}
	if n, ok := strictjson.ReadCounter(port); !ok || n < 1 || n > 65535 {
		reasons = append(reasons, path+" listenPort must be a port from 1 to 65535")
	}
	return reasons
}

// RuntimeNetworkVpnHub is the seed's data.IRuntimeNetworkVpnHub { clusterId, address, quicPort }:
// one cluster's hub as its relay bound it (docs/protocol.md#the-vpn-hub-report).
type RuntimeNetworkVpnHub struct {
	ClusterID string
	Address   string // an IPv4 literal
	QUICPort  int
}

// ClusterVpnHubReport is registerClusterVpnHub's request { hub, noisePublicKey } (project-defined,
// docs/protocol.md#attaching; the seeds name no report method): the hub exactly as the seed spells it,
// beside the hub's static Noise public key, which nodes' credentials name. The relay sends it in a
// call of its own after each accepted registration while its hub is on, so that a Cloudly that does
// not know the call refuses only it, never the registration. Cloudly answers {}; the relay reads
// nothing of the answer.
type ClusterVpnHubReport struct {
	Hub            RuntimeNetworkVpnHub
	NoisePublicKey [32]byte
}

// EncodeRegisterClusterVpnHubRequest writes { hub: { clusterId, address, quicPort }, noisePublicKey }
// with the key in base64url without padding. A public key is no secret.
func EncodeRegisterClusterVpnHubRequest(r ClusterVpnHubReport) []byte {
	b := strictjson.AppendString([]byte(`{"hub":{"clusterId":`), r.Hub.ClusterID)
	b = strictjson.AppendString(append(b, `,"address":`...), r.Hub.Address)
	b = strconv.AppendInt(append(b, `,"quicPort":`...), int64(r.Hub.QUICPort), 10)
	b = strictjson.AppendString(append(b, `},"noisePublicKey":`...), EncodeKey32(r.NoisePublicKey))
	return append(b, '}')
}

// ReadRegisterClusterVpnHubRequest reads registerClusterVpnHub's request exactly: the relay is its
// only writer (relay-minted), and hub is the seed's IRuntimeNetworkVpnHub, read exactly as a seed
// validator would. It is what a Cloudly (the simulator) reads of the relay's report.
func ReadRegisterClusterVpnHubRequest(raw []byte) (ClusterVpnHubReport, error) {
	const path = "cluster vpn hub report"
	var hub, key []byte
	if strictjson.ReadExact(raw, strictjson.Req("hub", &hub), strictjson.Req("noisePublicKey", &key)) != nil {
		return ClusterVpnHubReport{}, &InvalidError{[]string{path + " must use its exact schema"}}
	}
	h, reasons := readRuntimeNetworkVpnHub(hub, path+" hub")
	var r ClusterVpnHubReport
	if s, err := strictjson.ReadString(key); err != nil {
		reasons = append(reasons, path+" noisePublicKey must be a 32-byte key in base64url without padding")
	} else if r.NoisePublicKey, err = DecodeKey32(s); err != nil {
		reasons = append(reasons, path+" noisePublicKey must be a 32-byte key in base64url without padding")
	}
	if len(reasons) > 0 {
		return ClusterVpnHubReport{}, &InvalidError{reasons}
	}
	r.Hub = h
	return r, nil
}

// readRuntimeNetworkVpnHub reads IRuntimeNetworkVpnHub exactly: clusterId a canonical identifier,
// address a unicast IPv4 literal that is neither loopback nor link-local, quicPort a UDP port.
// Whether the address lies inside vpn.hubPrefix is Cloudly's to judge (its address plan).
func readRuntimeNetworkVpnHub(raw []byte, path string) (RuntimeNetworkVpnHub, []string) {
	var clusterID, address, port []byte
	if strictjson.ReadExact(raw, strictjson.Req("clusterId", &clusterID), strictjson.Req("address", &address), strictjson.Req("quicPort", &port)) != nil {
		return RuntimeNetworkVpnHub{}, []string{path + " must use its exact schema"}
	}
	var h RuntimeNetworkVpnHub
	var reasons []string
	if s, err := strictjson.ReadString(clusterID); err != nil || !IsCanonicalID(s) {
		reasons = append(reasons, path+" clusterId must be a canonical identifier")
	} else {
		h.ClusterID = s
	}
	if s, err := strictjson.ReadString(address); err != nil || !IsPlausibleUnicastIPv4(s) {
		reasons = append(reasons, path+" address must be a unicast IPv4 literal that is neither loopback nor link-local")
	} else {
		h.Address = s
	}
	if n, ok := strictjson.ReadCounter(port); !ok || n < 1 || n > 65535 {
		reasons = append(reasons, path+" quicPort must be a port from 1 to 65535")
	} else {
		h.QUICPort = int(n)
	}
	return h, reasons
}

// IsKey32 reports whether s is 32 bytes in canonical base64url without padding (43 characters,
// the last one carrying no stray bits).
func IsKey32(s string) bool {
	_, err := DecodeKey32(s)
	return err == nil
}

// RegisterClusterRelayResponse is the accepted answer to registerClusterRelay: Cloudly's own offer
// beside the cluster's relay origin (project-defined key names). Origin is "" when the
// answer states none (it is then left out of the encoding).
type RegisterClusterRelayResponse struct {
	Protocol ProtocolOffer `json:"protocol"`
	Origin   string        `json:"origin,omitempty"`
}

// ReadRegisterClusterRelayResponse reads registerClusterRelay's accepted answer tolerantly (its
// key names are this project's guess): the offer is required and read exactly, as every
// offer is (negotiating it is the caller's); origin is optional, and Origin is set only when it
// is a canonical https origin (or http, when allowHTTP: the relay's --insecure-plaintext). A
// missing or unusable origin is not a reason to refuse the attach: the relay only records it
// (docs/protocol.md#attaching). Every other member is ignored.
func ReadRegisterClusterRelayResponse(raw []byte, allowHTTP bool) (RegisterClusterRelayResponse, error) {
	const path = "cluster relay registration answer"
	var protocol, origin []byte
	if strictjson.ReadTolerant(raw, strictjson.Req("protocol", &protocol), strictjson.Opt("origin", &origin)) != nil {
		return RegisterClusterRelayResponse{}, &InvalidError{[]string{path + " must be an object carrying protocol"}}
	}
	offer, reasons := readProtocolOffer(protocol, path+" protocol")
	if len(reasons) > 0 {
		return RegisterClusterRelayResponse{}, &InvalidError{reasons}
	}
	answer := RegisterClusterRelayResponse{Protocol: offer}
	if s, err := strictjson.ReadString(origin); err == nil && (IsCanonicalOrigin(s, "https") || allowHTTP && IsCanonicalOrigin(s, "http")) {
		answer.Origin = s
	}
	return answer, nil
}

// EncodeCloudlyClientSessionRequest builds registerCloudlyClientSession's request { protocol, jwt }.
// It is the one place the machine JWT is revealed, into the bytes sent to Cloudly.
func EncodeCloudlyClientSessionRequest(offer ProtocolOffer, jwt Secret) []byte {
	o, _ := offer.MarshalJSON()
	b := append([]byte(`{"protocol":`), o...)
	b = append(b, `,"jwt":`...)
	b = strictjson.AppendString(b, jwt.Reveal())
	return append(b, '}')
}

// CloudlyClientSessionResponse is registerCloudlyClientSession's answer: Cloudly's offer.
type CloudlyClientSessionResponse struct {
	Protocol ProtocolOffer `json:"protocol"`
}

// CorestoreOrigin names one node's Corestore origin.
type CorestoreOrigin struct {
	NodeID string `json:"nodeId"`
	Origin string `json:"origin"`
}

// ClusterRelayConfig is pushClusterRelayConfig's config (project-defined, docs/protocol.md#relay-configuration-push). Relay nil
// means the operator disabled the relay: the relay treats it as relay-cluster-not-enabled.
type ClusterRelayConfig struct {
	ClusterID  string            `json:"clusterId"`
	Relay      *ClusterRelay     `json:"relay"`
	Corestores []CorestoreOrigin `json:"corestores"`
}

// MaxCorestores bounds the corestores list of a relay configuration.
const MaxCorestores = 4096

// ReadClusterRelayConfigPush reads pushClusterRelayConfig's request { config } tolerantly (the
// push is project-defined, docs/protocol.md#relay-configuration-push): it takes config.clusterId, config.relay (null, or an
// IClusterRelay block read exactly, as the seed's validator reads it) and config.corestores
// (optional: absent or null names none), each entry's nodeId and origin; every other member, at
// any level, is ignored. Corestore origins must be canonical https origins, or http when
// allowHTTP (the relay's --insecure-plaintext), and name each node once.
func ReadClusterRelayConfigPush(raw []byte, allowHTTP bool) (ClusterRelayConfig, error) {
	const path = "cluster relay config"
	var config []byte
	if strictjson.ReadTolerant(raw, strictjson.Req("config", &config)) != nil {
		return ClusterRelayConfig{}, &InvalidError{[]string{"cluster relay config push must be an object carrying config"}}
	}
	var clusterID, relay, corestores []byte
	if strictjson.ReadTolerant(config, strictjson.Req("clusterId", &clusterID), strictjson.Req("relay", &relay), strictjson.Opt("corestores", &corestores)) != nil {
		return ClusterRelayConfig{}, &InvalidError{[]string{path + " must be an object carrying clusterId and relay"}}
	}
	var cfg ClusterRelayConfig
	var reasons []string
	if s, err := strictjson.ReadString(clusterID); err != nil || !IsCanonicalID(s) {
		reasons = append(reasons, path+" clusterId must be a canonical identifier")
	} else {
		cfg.ClusterID = s
	}
	if !strictjson.IsNull(relay) {
		if r, rr := readClusterRelay(relay, path+" relay"); len(rr) > 0 {
			reasons = append(reasons, rr...)
		} else {
			cfg.Relay = &r
		}
	}
	var elems []json.RawMessage
	if corestores != nil && !strictjson.IsNull(corestores) {
		var err error
		if elems, err = strictjson.ReadArray(corestores); err != nil || len(elems) > MaxCorestores {
			reasons = append(reasons, path+" corestores must be an array of at most 4096 entries")
			elems = nil
		}
	}
	seen := make(map[string]bool, len(elems))
	for i, e := range elems {
		p := path + " corestores[" + strconv.Itoa(i) + "]"
		var nodeID, origin []byte
		if strictjson.ReadTolerant(e, strictjson.Req("nodeId", &nodeID), strictjson.Req("origin", &origin)) != nil {
			reasons = append(reasons, p+" must be an object carrying nodeId and origin")
			continue
		}
		node, err1 := strictjson.ReadString(nodeID)
		o, err2 := strictjson.ReadString(origin)
		switch {
		case err1 != nil || !IsClusterNodeID(node):
			reasons = append(reasons, p+" nodeId must be a cluster node id")
		case seen[node]:
			reasons = append(reasons, p+" nodeId must be unique")
		case err2 != nil || !(IsCanonicalOrigin(o, "https") || allowHTTP && IsCanonicalOrigin(o, "http")):
			reasons = append(reasons, p+" origin must be a canonical https origin")
		default:
			seen[node] = true
			cfg.Corestores = append(cfg.Corestores, CorestoreOrigin{NodeID: node, Origin: o})
		}
	}
	if len(reasons) > 0 {
		return ClusterRelayConfig{}, &InvalidError{reasons}
	}
	return cfg, nil
}
