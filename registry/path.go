package registry

import (
	"strings"

	"code.foss.global/serve.zone/relay/contracts"
)

// kind is what a /v2/ path names: a blob, a manifest, or anything else (the ping, tag lists,
// uploads, the catalog, referrers), which is only ever forwarded.
type kind uint8

const (
	kindOther kind = iota
	kindBlob
	kindManifest
)

func (k kind) String() string {
	switch k {
	case kindBlob:
		return "blob"
	case kindManifest:
		return "manifest"
	}
	return "other"
}

// Grammar limits of the OCI distribution specification.
const (
	maxNameLen = 255 // clients limit host/name to 255; a name alone never exceeds it
	maxTagLen  = 128
	sha256Hex  = 64
)

// digest is a content digest "<algorithm>:<encoded>" as the OCI image specification spells it.
type digest struct {
	Algorithm string
	Encoded   string
}

func (d digest) String() string { return d.Algorithm + ":" + d.Encoded }

// isSHA256 reports whether d is a sha256 digest; parseReference has checked its encoding.
func (d digest) isSHA256() bool { return d.Algorithm == "sha256" }

// target is a parsed /v2/<name>/(blobs|manifests)/<reference> path.
type target struct {
	Kind      kind
	Name      string // the repository name
	Reference string // a tag or a digest, as in the path
	Digest    digest // the reference as a digest; zero for a tag
}

// byDigest reports whether the path names content by digest (and so may be cached).
func (t target) byDigest() bool { return t.Digest.Algorithm != "" }

// parsePath parses /v2/<name>/(blobs|manifests)/<reference> with the distribution
// specification's grammar: <name> is components of [a-z0-9]+ joined by ".", "_", "__" or runs of
// "-", separated by "/", at most 255 bytes; a blob's reference is a digest; a manifest's is a
// digest or a tag ([A-Za-z0-9_][A-Za-z0-9._-]{0,127}). A sha256 digest must be 64 lowercase hex.
// Every other path answers false: it is forwarded as it is and never cached.
func parsePath(p string) (target, bool) {
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		return target{}, false
	}
	slash := strings.LastIndexByte(rest, '/')
	if slash < 0 {
		return target{}, false
	}
	ref := rest[slash+1:]
	rest = rest[:slash]
	slash = strings.LastIndexByte(rest, '/')
	if slash < 0 {
		return target{}, false
	}
	name, kw := rest[:slash], rest[slash+1:]
	var t target
	switch kw {
	case "blobs":
		t.Kind = kindBlob
	case "manifests":
		t.Kind = kindManifest
	default:
		return target{}, false
	}
	if !validName(name) {
		return target{}, false
	}
	t.Name, t.Reference = name, ref
	if d, ok := parseDigest(ref); ok {
		t.Digest = d
		return t, true
	}
	if t.Kind == kindManifest && validTag(ref) {
		return t, true
	}
	return target{}, false
}

// validName checks a repository name against the distribution specification's grammar.
func validName(name string) bool {
	if name == "" || len(name) > maxNameLen {
		return false
	}
	for comp := range strings.SplitSeq(name, "/") {
		if !validNameComponent(comp) {
			return false
		}
	}
	return true
}

// validNameComponent: [a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*
func validNameComponent(c string) bool {
	i := 0
	for {
		start := i
		for i < len(c) && isLowerAlnum(c[i]) {
			i++
		}
		if i == start {
			return false // empty component, or a separator not between alphanumerics
		}
		if i == len(c) {
			return true
		}
		switch c[i] {
		case '.':
			i++
		case '_':
			i++
			if i < len(c) && c[i] == '_' {
				i++
			}
		case '-':
			for i < len(c) && c[i] == '-' {
				i++
			}
		default:
			return false
		}
	}
}

// validTag: [A-Za-z0-9_][A-Za-z0-9._-]{0,127}
func validTag(s string) bool {
	if s == "" || len(s) > maxTagLen || s[0] == '.' || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(isAlnum(c) || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// parseDigest reads algorithm ":" encoded, where algorithm is [a-z0-9]+([+._-][a-z0-9]+)* and
// encoded [a-zA-Z0-9=_-]+. A sha256 digest must be exactly 64 lowercase hex digits.
func parseDigest(s string) (digest, bool) {
	alg, enc, ok := strings.Cut(s, ":")
	if !ok || !validAlgorithm(alg) || enc == "" {
		return digest{}, false
	}
	for i := 0; i < len(enc); i++ {
		if c := enc[i]; !(isAlnum(c) || c == '=' || c == '_' || c == '-') {
			return digest{}, false
		}
	}
	if alg == "sha256" && !contracts.IsLowerHex(enc, sha256Hex) {
		return digest{}, false
	}
	return digest{Algorithm: alg, Encoded: enc}, true
}

func validAlgorithm(a string) bool {
	i := 0
	for {
		start := i
		for i < len(a) && isLowerAlnum(a[i]) {
			i++
		}
		if i == start {
			return false
		}
		if i == len(a) {
			return true
		}
		switch a[i] {
		case '+', '.', '_', '-':
			i++
		default:
			return false
		}
	}
}

func isLowerAlnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
func isAlnum(c byte) bool      { return isLowerAlnum(c) || c >= 'A' && c <= 'Z' }

// cleanPath reports whether a request path may be forwarded: under /v2, with no empty, "." or
// ".." segment (a trailing slash is allowed: an upload starts at .../blobs/uploads/) and nothing
// that needs escaping, so that the upstream resolves exactly the path the relay judged.
func cleanPath(p, escaped string) bool {
	if p != escaped {
		return false
	}
	if p == "/v2" || p == "/v2/" {
		return true
	}
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		return false
	}
	segs := strings.Split(rest, "/")
	for i, s := range segs {
		if s == "." || s == ".." || s == "" && i != len(segs)-1 {
			return false
		}
	}
	return true
}
