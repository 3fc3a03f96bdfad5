package corestore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strconv"
	"strings"
	"unicode/utf8"

	"code.foss.global/serve.zone/relay/contracts"
	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// Every error Call returns is a *contracts.Refusal named restore-node-unreachable or
// restore-node-refused; callers test it with errors.Is.

// Outcome labels, for metrics and logs.
const (
	outcomeAnswered    = "answered"
	outcomeRefused     = "refused"
	outcomeOversized   = "oversized"
	outcomeUnreachable = "unreachable"
)

// MaxReasonBytes bounds the Corestore reason a refusal carries.
const MaxReasonBytes = 256

// unreachable classifies a transport failure: timeout, TLS, dial, or the connection failing.
func unreachable(origin string, err error, timeoutText string) *contracts.Refusal {
	var (
		unknownCA  x509.UnknownAuthorityError
		hostname   x509.HostnameError
		invalid    x509.CertificateInvalidError
		verify     *tls.CertificateVerificationError
		recordHdr  tls.RecordHeaderError
		alert      tls.AlertError
		netErr     net.Error
		opErr      *net.OpError
		tlsProblem string
	)
	switch {
	case errors.As(err, &verify):
		tlsProblem = shortTLS(verify.Err)
	case errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &invalid):
		tlsProblem = shortTLS(err)
	case errors.As(err, &recordHdr) || strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		tlsProblem = "the peer does not speak TLS"
	case errors.As(err, &alert):
		tlsProblem = "the peer sent a TLS alert"
	}
	switch {
	case tlsProblem != "":
		return contracts.RestoreNodeUnreachable.Refuse("TLS with Corestore at %s failed: %s", origin, tlsProblem)
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout():
		return contracts.RestoreNodeUnreachable.Refuse("Corestore at %s did not answer within %s", origin, timeoutText)
	case errors.Is(err, context.Canceled):
		return contracts.RestoreNodeUnreachable.Refuse("the call to Corestore at %s was abandoned", origin)
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return contracts.RestoreNodeUnreachable.Refuse("cannot connect to Corestore at %s", origin)
	}
	return contracts.RestoreNodeUnreachable.Refuse("the connection to Corestore at %s failed", origin)
}

// shortTLS names a certificate problem without the certificate's contents.
func shortTLS(err error) string {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &unknownCA):
		return "certificate signed by an unknown authority"
	case errors.As(err, &hostname):
		return "certificate is not valid for the origin's host"
	case errors.As(err, &invalid):
		if invalid.Reason == x509.Expired {
			return "certificate has expired or is not yet valid"
		}
		return "certificate is not valid"
	}
	return "certificate verification failed"
}

// refused builds restore-node-refused: <Corestore's own reason> from a non-2xx answer. The reason
// is the answer's JSON reason (or error, or message) member, else its text when it is plain text,
// else the HTTP status; then sanitized.
func refused(status int, contentType string, body []byte) *contracts.Refusal {
	reason := corestoreReason(contentType, body)
	if reason == "" {
		reason = "Corestore answered HTTP " + strconv.Itoa(status)
	}
	return contracts.RestoreNodeRefused.Refuse("%s", reason)
}

func corestoreReason(contentType string, body []byte) string {
	if strictjson.KindOf(body) == strictjson.KindObject {
		for _, key := range []string{"reason", "error", "message"} {
			raw, ok, err := strictjson.Lookup(body, key)
			if err != nil || !ok {
				continue
			}
			if s, err := strictjson.ReadString(raw); err == nil {
				return SanitizeReason(s)
			}
		}
		return ""
	}
	if strings.HasPrefix(strings.ToLower(contentType), "text/plain") && utf8.Valid(body) {
		return SanitizeReason(string(body))
	}
	return ""
}

// SanitizeReason makes a peer's reason safe to pass on: control characters become spaces, runs of
// spaces collapse, every token-like run of 32 or more characters from the base64, base64url and
// JWS alphabets (a grant, a bearer, a key, a digest) becomes [redacted], and the result is cut to
// MaxReasonBytes on a rune boundary.
func SanitizeReason(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	var b strings.Builder
	space := false
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 || r == '\u2028' || r == '\u2029' {
			r = ' '
		}
		if r == ' ' {
			if space || b.Len() == 0 {
				continue
			}
			space = true
		} else {
			space = false
		}
		b.WriteRune(r)
	}
	out := redactTokens(strings.TrimRight(b.String(), " "))
	if len(out) > MaxReasonBytes {
		cut := MaxReasonBytes - len("…")
		for cut > 0 && !utf8.RuneStart(out[cut]) {
			cut--
		}
		out = out[:cut] + "…"
	}
	return out
}

const minTokenRun = 32

func isTokenByte(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' ||
		c == '+' || c == '/' || c == '=' || c == '-' || c == '_' || c == '.' || c == '~'
}

func redactTokens(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		if !isTokenByte(s[i]) {
			b.WriteByte(s[i])
			i++
			continue
		}
		j := i
		for j < len(s) && isTokenByte(s[j]) {
			j++
		}
		if j-i >= minTokenRun {
			b.WriteString("[redacted]")
		} else {
			b.WriteString(s[i:j])
		}
		i = j
	}
	return b.String()
}
