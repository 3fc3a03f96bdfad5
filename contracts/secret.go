package contracts

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
)

// Secret holds a bearer, JWT, grant or key. It prints as [secret] under every fmt verb, refuses to
// be marshaled as JSON or text, and gives its value only to an explicit Reveal, so that a secret
// cannot reach a log line, an error text or a file by accident.
type Secret struct{ value string }

// NewSecret wraps s.
func NewSecret(s string) Secret { return Secret{s} }

// Reveal returns the secret's value. Call it only where the value goes onto the wire.
func (s Secret) Reveal() string { return s.value }

// IsZero reports whether the secret is empty.
func (s Secret) IsZero() bool { return s.value == "" }

func (s Secret) String() string   { return "[secret]" }
func (s Secret) GoString() string { return "contracts.Secret([secret])" }

// Format prints [secret] whatever the verb.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, "[secret]") }

// ErrSecretMarshal is returned by every attempt to marshal a Secret.
var ErrSecretMarshal = errors.New("contracts: a secret is never marshaled")

func (s Secret) MarshalJSON() ([]byte, error) { return nil, ErrSecretMarshal }
func (s Secret) MarshalText() ([]byte, error) { return nil, ErrSecretMarshal }

// DecodeKey32 decodes a 32-byte key in canonical base64url without padding, the encoding of every
// Curve25519 key on the relay's wire (project-defined).
func DecodeKey32(s string) ([32]byte, error) {
	var k [32]byte
	if len(s) != 43 {
		return k, errors.New("key must be 32 bytes in base64url without padding")
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(b) != 32 {
		return k, errors.New("key must be 32 bytes in base64url without padding")
	}
	copy(k[:], b)
	return k, nil
}

// EncodeKey32 encodes a 32-byte key in base64url without padding.
func EncodeKey32(k [32]byte) string { return base64.RawURLEncoding.EncodeToString(k[:]) }

// ShortKey is the form a public key is logged in: its first 8 characters.
func ShortKey(k [32]byte) string { return EncodeKey32(k)[:8] }
