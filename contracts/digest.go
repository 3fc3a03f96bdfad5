package contracts

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// Domain-separated digests of canonical JSON (strictjson.Canonicalize).
//
// ASSUMPTION (project-defined, recorded in docs/decisions.md): the seeds name digests such as
// "hashes every field except digest under its own domain" but not the exact preimage. This file is
// the one place that decides it:
//
//	digest   = "sha256:" + lowercase hex of SHA-256(preimage)
//	preimage = UTF-8 domain || "\n" || canonical JSON of the value
//
// If the seeds' exact preimage turns out different, it is corrected here and in the golden
// vectors under testdata/digest.

// Digest returns "sha256:<hex>" of the domain-separated preimage of an already canonical value.
func Digest(domain string, canonical []byte) string {
	h := sha256.New()
	h.Write([]byte(domain))
	h.Write([]byte{'\n'})
	h.Write(canonical)
	var sum [sha256.Size]byte
	return "sha256:" + hex.EncodeToString(h.Sum(sum[:0]))
}

// DigestOf canonicalizes the JSON value raw and returns its digest under domain.
func DigestOf(domain string, raw []byte) (string, error) {
	c, err := strictjson.Canonicalize(raw)
	if err != nil {
		return "", err
	}
	return Digest(domain, c), nil
}

// DigestWithout returns the digest under domain of the JSON object raw without its member named
// field: the seeds' "every field except digest" rule.
func DigestWithout(domain string, raw []byte, field string) (string, error) {
	c, err := strictjson.CanonicalWithout(raw, field)
	if err != nil {
		return "", err
	}
	return Digest(domain, c), nil
}

// IsSha256Digest reports whether s is "sha256:" followed by 64 lowercase hex digits.
func IsSha256Digest(s string) bool {
	hexPart, ok := strings.CutPrefix(s, "sha256:")
	return ok && IsLowerHex(hexPart, 64)
}

// IsLowerHex reports whether s is exactly n lowercase hexadecimal digits.
func IsLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
