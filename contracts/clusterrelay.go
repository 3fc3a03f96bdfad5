package contracts

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// The relay's own session with Cloudly: its registration, the cluster relay block and the
// configuration Cloudly pushes (SPEC §4, CONTRACTS §4).

// Methods of the relay's own session with Cloudly.
const (
	MethodRegisterCloudlyClientSession = "registerCloudlyClientSession" // relay → Cloudly (seed)
	MethodRegisterClusterRelay         = "registerClusterRelay"         // relay → Cloudly (seed)
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
		if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
			return false
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

// isCanonicalHostname accepts lowercase LDH DNS names and canonical dotted-quad IPv4 literals.
func isCanonicalHostname(host string) bool {
	h := strings.TrimSuffix(host, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	labels := strings.Split(h, ".")
	last := labels[len(labels)-1]
	if last != "" && last[0] >= '0' && last[0] <= '9' {
		// The URL parser reads a host whose last label is numeric as IPv4 and rewrites it, dropping
		// a trailing dot: only a dotted quad without one is kept as it is.
		a, err := netip.ParseAddr(h)
		return err == nil && a.Is4() && a.String() == h && !strings.HasSuffix(host, ".")
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
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
	members, err := ReadObject(raw)
	if err != nil || !hasExactKeys(members, "origin") {
		return []string{path + " must use its exact schema"}
	}
	origin, err := ReadString(members[0].Value)
	if err != nil || !IsCanonicalOrigin(origin, "https") {
		return []string{path + " origin must be a canonical https origin"}
	}
	return nil
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

// VPNHubEndpoint is the project-defined relay.vpnHub member: where the relay's VPN hub listens and
// its static Noise public key (32 bytes, base64url without padding).
type VPNHubEndpoint struct {
	Address        string `json:"address"`
	QUICPort       int    `json:"quicPort"`
	NoisePublicKey string `json:"noisePublicKey"`
}

// ClusterRelayRegistration is IRegisterClusterRelayRequest.relay. Version is the relay build, a
// different fact from the protocol offer's interfacesVersion.
type ClusterRelayRegistration struct {
	Version       string          `json:"version"`
	NodeID        string          `json:"nodeId"`
	ListenAddress string          `json:"listenAddress"`
	ListenPort    int             `json:"listenPort"`
	VPNHub        *VPNHubEndpoint `json:"vpnHub"`
}

// RegisterClusterRelayRequest is IRegisterClusterRelayRequest.
type RegisterClusterRelayRequest struct {
	Protocol             ProtocolOffer            `json:"protocol"`
	Relay                ClusterRelayRegistration `json:"relay"`
	RegistrationSequence int64                    `json:"registrationSequence"`
}

// ValidateRegisterClusterRelayRequest is validateRegisterClusterRelayRequest: shape only, one
// reason per violation. path defaults to "cluster relay registration".
func ValidateRegisterClusterRelayRequest(raw []byte, path string) []string {
	if path == "" {
		path = "cluster relay registration"
	}
	members, err := ReadObject(raw)
	if err != nil || !hasExactKeys(members, "protocol", "relay", "registrationSequence") {
		return []string{path + " must use its exact schema"}
	}
	m := byKey(members)
	reasons := ValidateProtocolOffer(m["protocol"], path+" protocol")
	reasons = append(reasons, validateRelayBlock(m["relay"], path+" relay")...)
	if _, ok := ReadCounter(m["registrationSequence"]); !ok {
		reasons = append(reasons, path+" registrationSequence must be a non-negative safe integer")
	}
	return reasons
}

func validateRelayBlock(raw []byte, path string) []string {
	members, err := ReadObject(raw)
	if err != nil || !hasExactKeys(members, "version", "nodeId", "listenAddress", "listenPort", "vpnHub") {
		return []string{path + " must use its exact schema"}
	}
	m := byKey(members)
	var reasons []string
	if s, err := ReadString(m["version"]); err != nil || !IsReleaseVersion(s) {
		reasons = append(reasons, path+" version must be a release version")
	}
	if s, err := ReadString(m["nodeId"]); err != nil || !IsClusterNodeID(s) {
		reasons = append(reasons, path+" nodeId must be a cluster node id")
	}
	if s, err := ReadString(m["listenAddress"]); err != nil || !IsPlausibleUnicastIPv4(s) {
		reasons = append(reasons, path+" listenAddress must be a unicast IPv4 literal that is neither loopback nor link-local")
	}
	if n, ok := ReadCounter(m["listenPort"]); !ok || n < 1 || n > 65535 {
		reasons = append(reasons, path+" listenPort must be a port from 1 to 65535")
	}
	if !IsNull(m["vpnHub"]) {
		reasons = append(reasons, validateVPNHubEndpoint(m["vpnHub"], path+" vpnHub")...)
	}
	return reasons
}

func validateVPNHubEndpoint(raw []byte, path string) []string {
	members, err := ReadObject(raw)
	if err != nil || !hasExactKeys(members, "address", "quicPort", "noisePublicKey") {
		return []string{path + " must be null or use its exact schema"}
	}
	m := byKey(members)
	var reasons []string
	if s, err := ReadString(m["address"]); err != nil || !IsPlausibleUnicastIPv4(s) {
		reasons = append(reasons, path+" address must be a unicast IPv4 literal that is neither loopback nor link-local")
	}
	if n, ok := ReadCounter(m["quicPort"]); !ok || n < 1 || n > 65535 {
		reasons = append(reasons, path+" quicPort must be a port from 1 to 65535")
	}
	if s, err := ReadString(m["noisePublicKey"]); err != nil || !IsKey32(s) {
		reasons = append(reasons, path+" noisePublicKey must be a 32-byte key in base64url without padding")
	}
	return reasons
}

// IsKey32 reports whether s is 32 bytes in canonical base64url without padding (43 characters,
// the last one carrying no stray bits).
func IsKey32(s string) bool {
	_, err := DecodeKey32(s)
	return err == nil
}

// RegisterClusterRelayResponse is the accepted answer to registerClusterRelay: Cloudly's own offer
// beside the cluster's relay origin (project-defined key names, OQ-5).
type RegisterClusterRelayResponse struct {
	Protocol ProtocolOffer `json:"protocol"`
	Origin   string        `json:"origin"`
}

// EncodeCloudlyClientSessionRequest builds registerCloudlyClientSession's request { protocol, jwt }.
// It is the one place the machine JWT is revealed, into the bytes sent to Cloudly.
func EncodeCloudlyClientSessionRequest(offer ProtocolOffer, jwt Secret) []byte {
	o, _ := offer.MarshalJSON()
	b := append([]byte(`{"protocol":`), o...)
	b = append(b, `,"jwt":`...)
	b = AppendString(b, jwt.Reveal())
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

// ClusterRelayConfig is pushClusterRelayConfig's config (project-defined, SPEC §4.1). Relay nil
// means the operator disabled the relay: the relay treats it as relay-cluster-not-enabled.
type ClusterRelayConfig struct {
	ClusterID  string            `json:"clusterId"`
	Relay      *ClusterRelay     `json:"relay"`
	Corestores []CorestoreOrigin `json:"corestores"`
}

// MaxCorestores bounds the corestores list of a relay configuration.
const MaxCorestores = 4096

// ReadClusterRelayConfigPush reads pushClusterRelayConfig's request { config }. Corestore origins
// must be canonical https origins, or http when allowHTTP (the relay's --insecure-plaintext).
func ReadClusterRelayConfigPush(raw []byte, allowHTTP bool) (ClusterRelayConfig, error) {
	const path = "cluster relay config"
	members, err := ReadObject(raw)
	if err != nil || !hasExactKeys(members, "config") {
		return ClusterRelayConfig{}, &InvalidError{[]string{"cluster relay config push must use its exact schema"}}
	}
	members, err = ReadObject(members[0].Value)
	if err != nil || !hasExactKeys(members, "clusterId", "relay", "corestores") {
		return ClusterRelayConfig{}, &InvalidError{[]string{path + " must use its exact schema"}}
	}
	m := byKey(members)
	var cfg ClusterRelayConfig
	var reasons []string
	if s, err := ReadString(m["clusterId"]); err != nil || !IsCanonicalID(s) {
		reasons = append(reasons, path+" clusterId must be a canonical identifier")
	} else {
		cfg.ClusterID = s
	}
	if !IsNull(m["relay"]) {
		if r := ValidateClusterRelay(m["relay"], path+" relay"); len(r) > 0 {
			reasons = append(reasons, r...)
		} else {
			cfg.Relay = new(ClusterRelay)
			_ = json.Unmarshal(m["relay"], cfg.Relay)
		}
	}
	elems, err := ReadArray(m["corestores"])
	if err != nil || len(elems) > MaxCorestores {
		reasons = append(reasons, path+" corestores must be an array of at most 4096 entries")
	}
	seen := make(map[string]bool, len(elems))
	for i, e := range elems {
		p := path + " corestores[" + strconv.Itoa(i) + "]"
		em, err := ReadObject(e)
		if err != nil || !hasExactKeys(em, "nodeId", "origin") {
			reasons = append(reasons, p+" must use its exact schema")
			continue
		}
		mm := byKey(em)
		node, err1 := ReadString(mm["nodeId"])
		origin, err2 := ReadString(mm["origin"])
		switch {
		case err1 != nil || !IsClusterNodeID(node):
			reasons = append(reasons, p+" nodeId must be a cluster node id")
		case seen[node]:
			reasons = append(reasons, p+" nodeId must be unique")
		case err2 != nil || !(IsCanonicalOrigin(origin, "https") || allowHTTP && IsCanonicalOrigin(origin, "http")):
			reasons = append(reasons, p+" origin must be a canonical https origin")
		default:
			seen[node] = true
			cfg.Corestores = append(cfg.Corestores, CorestoreOrigin{NodeID: node, Origin: origin})
		}
	}
	if len(reasons) > 0 {
		return ClusterRelayConfig{}, &InvalidError{reasons}
	}
	return cfg, nil
}

// hasExactKeys reports whether members has exactly the required keys plus any of the optional
// ones: required keys first, then a "?" marker, then optional keys. ReadObject already refused
// repeated keys.
func hasExactKeys(members []Member, keys ...string) bool {
	required, optional := keys, []string(nil)
	if i := slices.Index(keys, "?"); i >= 0 {
		required, optional = keys[:i], keys[i+1:]
	}
	found := 0
	for _, m := range members {
		switch {
		case slices.Contains(required, m.Key):
			found++
		case slices.Contains(optional, m.Key):
		default:
			return false
		}
	}
	return found == len(required)
}

// HasExactKeys is hasExactKeys for feature packages: required keys, then "?", then optional ones.
func HasExactKeys(members []Member, keys ...string) bool { return hasExactKeys(members, keys...) }

// byKey indexes members by key. Callers have checked the key set already.
func byKey(members []Member) map[string][]byte {
	m := make(map[string][]byte, len(members))
	for _, mem := range members {
		m[mem.Key] = mem.Value
	}
	return m
}

// MembersByKey is byKey for feature packages.
func MembersByKey(members []Member) map[string][]byte { return byKey(members) }
