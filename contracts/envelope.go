package contracts

import (
	"crypto/ecdh"
	"crypto/hpke"
	"encoding/base64"
	"errors"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// Secret-recipient enrollment and sealed envelopes (docs/platform.md). The seeds name the two enrollment
// methods (beginSecretRecipientEnrollment, completeSecretRecipientEnrollment) and say the relay
// is an enrolled X25519 recipient; they do not spell the bodies or the envelope. Everything here
// is therefore project-defined, a guess at what Cloudly will send, read tolerantly:
//
//	relay → Cloudly  beginSecretRecipientEnrollment    { publicKey }              → { enrollmentId, challenge }
//	relay → Cloudly  completeSecretRecipientEnrollment { enrollmentId, response } → {}
//	Cloudly → relay  pushCorestoreCredential           { nodeId, envelope }       → {}
//
// publicKey is the relay's X25519 public key, 32 bytes in base64url without padding; challenge an
// envelope (info EnvelopeInfoEnrollment) sealing 32 random bytes, response those bytes in
// base64url; envelope (info EnvelopeInfoCorestoreCredential) seals the credential's UTF-8 bytes.
//
// An envelope is HPKE base mode (RFC 9180) with DHKEM(X25519, HKDF-SHA256), HKDF-SHA256 and
// ChaCha20-Poly1305, empty AAD, written as base64url without padding of enc ‖ ciphertext.
// OpenEnvelope is the relay's one opener. THE ENVELOPE IS A GUESS (project-defined): the seeds say
// "strict SmartCrypto X25519 envelopes" for secret values and spell nothing more; when Cloudly's
// real envelope is known, it replaces this function and nothing else.

// HPKE info strings of the two envelopes (project-defined).
const (
	EnvelopeInfoEnrollment          = "serve.zone/secret-recipient-enrollment"
	EnvelopeInfoCorestoreCredential = "serve.zone/corestore-credential"
)

// Bounds (project-defined): an enrollment challenge opens to 32 bytes; a credential to at most
// MaxCredentialBytes; an envelope's text is bounded by what those seal to.
const (
	EnrollmentChallengeBytes = 32
	MaxCredentialBytes       = 4096
	maxEnvelopeText          = 8192
	maxEnrollmentIDLen       = 256
)

// ErrEnvelope is every envelope that does not open: not base64url, too short or long, a wrong key
// or info, a tampered ciphertext. It names nothing of the envelope.
var ErrEnvelope = errors.New("envelope does not open with the relay's recipient key")

// envelopeSuite is the one suite of the guess; the KEM, DHKEM(X25519, HKDF-SHA256), is the one
// the key's curve implies (hpke.NewDHKEMPrivateKey of an X25519 key).
func envelopeSuite() (hpke.KEM, hpke.KDF, hpke.AEAD) {
	return hpke.DHKEM(ecdh.X25519()), hpke.HKDFSHA256(), hpke.ChaCha20Poly1305()
}

// OpenEnvelope opens envelope (base64url without padding of enc ‖ ciphertext) with the recipient
// key priv under info. The error is ErrEnvelope, whatever went wrong.
func OpenEnvelope(priv *ecdh.PrivateKey, info, envelope string) ([]byte, error) {
	if priv == nil || priv.Curve() != ecdh.X25519() || len(envelope) > maxEnvelopeText {
		return nil, ErrEnvelope
	}
	ct, err := base64.RawURLEncoding.Strict().DecodeString(envelope)
	if err != nil {
		return nil, ErrEnvelope
	}
	_, kdf, aead := envelopeSuite()
	k, err := hpke.NewDHKEMPrivateKey(priv)
	if err != nil {
		return nil, ErrEnvelope
	}
	pt, err := hpke.Open(k, kdf, aead, []byte(info), ct)
	if err != nil {
		return nil, ErrEnvelope
	}
	return pt, nil
}

// SealEnvelope seals plaintext to the X25519 public key pub under info: the sender's side of
// OpenEnvelope, for the simulated Cloudly and tests (the relay never seals).
func SealEnvelope(pub *ecdh.PublicKey, info string, plaintext []byte) (string, error) {
	_, kdf, aead := envelopeSuite()
	k, err := hpke.NewDHKEMPublicKey(pub)
	if err != nil {
		return "", err
	}
	ct, err := hpke.Seal(k, kdf, aead, []byte(info), plaintext)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(ct), nil
}

// EncodeBeginEnrollment is beginSecretRecipientEnrollment's request { publicKey }.
func EncodeBeginEnrollment(pub *ecdh.PublicKey) []byte {
	b := strictjson.AppendString([]byte(`{"publicKey":`), base64.RawURLEncoding.EncodeToString(pub.Bytes()))
	return append(b, '}')
}

// ReadBeginEnrollment reads beginSecretRecipientEnrollment's request (the simulated Cloudly's
// side): the X25519 public key.
func ReadBeginEnrollment(raw []byte) (*ecdh.PublicKey, error) {
	var v []byte
	if strictjson.ReadTolerant(raw, strictjson.Req("publicKey", &v)) != nil {
		return nil, &InvalidError{[]string{"enrollment must carry publicKey"}}
	}
	s, err := strictjson.ReadString(v)
	if err != nil {
		return nil, &InvalidError{[]string{"enrollment publicKey must be a string"}}
	}
	k, err := DecodeKey32(s)
	if err != nil {
		return nil, &InvalidError{[]string{"enrollment publicKey: " + err.Error()}}
	}
	return ecdh.X25519().NewPublicKey(k[:])
}

// Enrollment is beginSecretRecipientEnrollment's answer { enrollmentId, challenge }.
type Enrollment struct {
	ID        string
	Challenge string // an envelope
}

// ReadEnrollment reads beginSecretRecipientEnrollment's answer tolerantly.
func ReadEnrollment(raw []byte) (Enrollment, error) {
	var id, challenge []byte
	if strictjson.ReadTolerant(raw, strictjson.Req("enrollmentId", &id), strictjson.Req("challenge", &challenge)) != nil {
		return Enrollment{}, &InvalidError{[]string{"enrollment answer must carry enrollmentId and challenge"}}
	}
	var e Enrollment
	var err error
	if e.ID, err = strictjson.ReadString(id); err != nil || e.ID == "" || len(e.ID) > maxEnrollmentIDLen {
		return Enrollment{}, &InvalidError{[]string{"enrollment answer enrollmentId must be a string of 1 to 256 bytes"}}
	}
	if e.Challenge, err = strictjson.ReadString(challenge); err != nil {
		return Enrollment{}, &InvalidError{[]string{"enrollment answer challenge must be a string"}}
	}
	return e, nil
}

// EncodeCompleteEnrollment is completeSecretRecipientEnrollment's request { enrollmentId,
// response }: response the opened challenge in base64url without padding.
func EncodeCompleteEnrollment(id string, opened []byte) []byte {
	b := strictjson.AppendString([]byte(`{"enrollmentId":`), id)
	b = strictjson.AppendString(append(b, `,"response":`...), base64.RawURLEncoding.EncodeToString(opened))
	return append(b, '}')
}

// CorestoreCredentialPush is pushCorestoreCredential's request { nodeId, envelope }.
type CorestoreCredentialPush struct {
	NodeID   string
	Envelope string
}

// ReadCorestoreCredentialPush reads pushCorestoreCredential's request tolerantly: nodeId by the
// node-id reader, envelope a string. Reasons never quote the envelope.
func ReadCorestoreCredentialPush(raw []byte) (CorestoreCredentialPush, error) {
	var node, env []byte
	if strictjson.ReadTolerant(raw, strictjson.Req("nodeId", &node), strictjson.Req("envelope", &env)) != nil {
		return CorestoreCredentialPush{}, &InvalidError{[]string{"Corestore credential push must carry nodeId and envelope"}}
	}
	var p CorestoreCredentialPush
	var err error
	if p.NodeID, err = strictjson.ReadString(node); err != nil || !IsClusterNodeID(p.NodeID) {
		return CorestoreCredentialPush{}, &InvalidError{[]string{"Corestore credential push nodeId must be a cluster node id"}}
	}
	if p.Envelope, err = strictjson.ReadString(env); err != nil || p.Envelope == "" {
		return CorestoreCredentialPush{}, &InvalidError{[]string{"Corestore credential push envelope must be a non-empty string"}}
	}
	return p, nil
}
