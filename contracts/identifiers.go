package contracts

import (
	"net/netip"
	"strconv"
	"strings"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// Identifier vocabularies (seed-defined, docs/protocol.md#identifiers-digests-and-keys).

// IsCanonicalID is the canonical identifier rule ^[A-Za-z0-9][A-Za-z0-9:._-]{0,199}$: organizations,
// clusters, services, namespaces, sessions, authorities and every content id derived from them.
func IsCanonicalID(s string) bool {
	if len(s) == 0 || len(s) > 200 || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != ':' && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// IsClusterNodeID is data.isClusterNodeId, ^[A-Za-z0-9_-]{1,128}$: the URL alphabet, a leading
// "-" or "_" included. Every member that names a node of a cluster is judged with it, never with
// the canonical rule, which would refuse nodes the contracts themselves enrolled.
func IsClusterNodeID(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// ReplicaID is a decomposed runtime replica id "<node id>.<index>".
type ReplicaID struct {
	NodeID string
	Index  int64
}

// ReadReplicaID is data.isRuntimeReplicaId: the part before the last dot in the node vocabulary,
// the index a safe integer counted from zero, never zero-padded. A name without such an index
// (node-a.01, say) is not a replica id; it is an opaque slot name read with IsCanonicalID.
func ReadReplicaID(s string) (ReplicaID, bool) {
	dot := strings.LastIndexByte(s, '.')
	if dot < 0 {
		return ReplicaID{}, false
	}
	node, idx := s[:dot], s[dot+1:]
	if !IsClusterNodeID(node) || idx == "" || (len(idx) > 1 && idx[0] == '0') {
		return ReplicaID{}, false
	}
	for i := 0; i < len(idx); i++ {
		if idx[i] < '0' || idx[i] > '9' {
			return ReplicaID{}, false
		}
	}
	n, err := strconv.ParseInt(idx, 10, 64)
	if err != nil || n > strictjson.MaxSafeInteger {
		return ReplicaID{}, false
	}
	return ReplicaID{NodeID: node, Index: n}, true
}

// IsCanonicalUUID reports whether s is a canonical lowercase UUID (8-4-4-4-12 lowercase hex), the
// form of nodeInstanceNonce.
func IsCanonicalUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// IsPlausibleUnicastIPv4 reports whether s is a dotted-quad IPv4 literal (no leading zeros) that a
// peer can be reached on: not unspecified, loopback, link-local, multicast or broadcast. It is the
// rule for listenAddress and uplinkAddress.
func IsPlausibleUnicastIPv4(s string) bool {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() || a.String() != s {
		return false
	}
	return !a.IsUnspecified() && !a.IsLoopback() && !a.IsLinkLocalUnicast() && !a.IsMulticast() &&
		a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

func isAlnum(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
}
