package vpnhub

import (
	"crypto/ecdh"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"code.foss.global/serve.zone/relay/contracts"
)

// StaticKey is a static Curve25519 key pair: the hub's, or a member's in the client. It prints
// nothing of the private half.
type StaticKey struct {
	private [32]byte
	Public  [32]byte
}

func (k StaticKey) String() string {
	return "vpnhub.StaticKey(" + contracts.ShortKey(k.Public) + "…)"
}

// GoString keeps %#v, which would print the private array field by field, to String's form.
func (k StaticKey) GoString() string { return k.String() }

// Private returns the private key bytes, for the Noise handshake only.
func (k *StaticKey) Private() [32]byte { return k.private }

// GenerateKey creates a new static key.
func GenerateKey() (StaticKey, error) {
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return StaticKey{}, err
	}
	return keyFrom(priv.Bytes())
}

// KeyFromPrivate builds the key pair of a private key, such as the client key pair of a node's
// managed VPN credential.
func KeyFromPrivate(private [32]byte) (StaticKey, error) { return keyFrom(private[:]) }

func keyFrom(b []byte) (StaticKey, error) {
	priv, err := ecdh.X25519().NewPrivateKey(b)
	if err != nil {
		return StaticKey{}, err
	}
	var k StaticKey
	copy(k.private[:], priv.Bytes())
	copy(k.Public[:], priv.PublicKey().Bytes())
	return k, nil
}

// Key file format (project-defined): one line, the 32-byte private key in base64url without
// padding. The file is created with mode 0600 and never rewritten.

// ErrKeyFileExists is returned by WriteNewKeyFile when the file is already there.
var ErrKeyFileExists = errors.New("hub key file already exists")

// WriteNewKeyFile creates path (0600, failing if it exists) holding a new key.
func WriteNewKeyFile(path string) (StaticKey, error) {
	k, err := GenerateKey()
	if err != nil {
		return StaticKey{}, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return StaticKey{}, fmt.Errorf("%w: %s", ErrKeyFileExists, path)
		}
		return StaticKey{}, fmt.Errorf("create hub key file %s: %w", path, errors.Unwrap(err))
	}
	_, werr := f.WriteString(contracts.EncodeKey32(k.private) + "\n")
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(path)
		return StaticKey{}, fmt.Errorf("write hub key file %s: %w", path, werr)
	}
	return k, nil
}

// LoadKeyFile reads the key in path. Errors name the file, never its content.
func LoadKeyFile(path string) (StaticKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return StaticKey{}, fmt.Errorf("read hub key file %s: %w", path, errors.Unwrap(err))
	}
	raw, err := contracts.DecodeKey32(strings.TrimSpace(string(b)))
	if err != nil {
		return StaticKey{}, fmt.Errorf("hub key file %s: %w", path, err)
	}
	return keyFrom(raw[:])
}

// LoadOrCreateKeyFile loads path, creating it with a new key (0600) when it does not exist, so
// that nodes' credentials survive a relay restart.
func LoadOrCreateKeyFile(path string) (StaticKey, error) {
	k, err := LoadKeyFile(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	k, err = WriteNewKeyFile(path)
	if errors.Is(err, ErrKeyFileExists) { // created concurrently
		return LoadKeyFile(path)
	}
	return k, err
}
