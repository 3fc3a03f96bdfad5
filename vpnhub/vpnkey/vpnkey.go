// Package vpnkey holds the static Curve25519 key pairs of the managed VPN (docs/protocol.md#vpn-hub): the hub's,
// kept in its key file, and a member's, from its managed VPN credential. It is shared by the hub
// and its client and depends on neither. A Pair never prints its private half, and no error
// quotes a key file's content.
package vpnkey

import (
	"crypto/ecdh"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
)

// Pair is a static Curve25519 key pair. It prints nothing of the private half.
type Pair struct {
	private [32]byte
	Public  [32]byte
}

func (k Pair) String() string {
	return "vpnkey.Pair(" + contracts.ShortKey(k.Public) + "…)"
}

// GoString keeps %#v, which would print the private array field by field, to String's form.
func (k Pair) GoString() string { return k.String() }

// Private returns the private key bytes, for the Noise handshake and the keys a hub derives from
// its own (its QUIC stateless-reset and token keys) only.
func (k *Pair) Private() [32]byte { return k.private }

// Generate creates a new key pair.
func Generate() (Pair, error) {
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	return pairOf(priv.Bytes())
}

// FromPrivate builds the key pair of a private key, such as the client key pair of a node's
// managed VPN credential.
func FromPrivate(private [32]byte) (Pair, error) { return pairOf(private[:]) }

func pairOf(b []byte) (Pair, error) {
	priv, err := ecdh.X25519().NewPrivateKey(b)
	if err != nil {
		return Pair{}, err
	}
	var k Pair
	copy(k.private[:], priv.Bytes())
	copy(k.Public[:], priv.PublicKey().Bytes())
	return k, nil
}

// Key file format (project-defined): one line, the 32-byte private key in base64url without
// padding. The file is created with mode 0600, synced to disk with its directory entry, and never
// rewritten. It is opened without following a symbolic link at its path, and a file that group or
// world may read is loaded with a warning: the key would survive, but anyone with that access
// could impersonate the hub.

// ErrFileExists is returned by WriteNewFile when the file is already there.
var ErrFileExists = errors.New("key file already exists")

// fsync makes a created file, or its directory, durable. Tests replace it to see it called.
var fsync = (*os.File).Sync

// WriteNewFile creates path (0600, failing if anything is there, a symbolic link included) holding
// a new key, and syncs the file and its directory before it returns: a relay that crashes right
// after must not come back with an empty key file, or none, and so a new hub key that every
// node's credential misses.
func WriteNewFile(path string) (Pair, error) {
	k, err := Generate()
	if err != nil {
		return Pair{}, err
	}
	if err := WriteSecretFile(path, k.private); err != nil {
		return Pair{}, err
	}
	return k, nil
}

// WriteSecretFile writes a 32-byte secret in the key file format, as WriteNewFile does: the
// replicas' shared replication key (docs/ha.md) uses it too.
func WriteSecretFile(path string, secret [32]byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%w: %s", ErrFileExists, path)
		}
		return fmt.Errorf("create key file %s: %w", path, errors.Unwrap(err))
	}
	_, err = f.WriteString(contracts.EncodeKey32(secret) + "\n")
	if err == nil {
		err = fsync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("write key file %s: %w", path, errors.Unwrap(err))
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = fsync(d)
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// LoadFile reads the key in path. A symbolic link at path is refused; a file that group or world
// may read is loaded and log gets a warning. Errors name the file, never its content.
func LoadFile(path string, log zerolog.Logger) (Pair, error) {
	raw, err := ReadSecretFile(path, log)
	if err != nil {
		return Pair{}, err
	}
	return pairOf(raw[:])
}

// ReadSecretFile reads a 32-byte secret in the key file format, as LoadFile does.
func ReadSecretFile(path string, log zerolog.Logger) ([32]byte, error) {
	var none [32]byte
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return none, fmt.Errorf("read key file %s: is a symbolic link; name the file itself", path)
		}
		return none, fmt.Errorf("read key file %s: %w", path, errors.Unwrap(err))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return none, fmt.Errorf("read key file %s: %w", path, errors.Unwrap(err))
	}
	if !st.Mode().IsRegular() {
		return none, fmt.Errorf("read key file %s: not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		log.Warn().Str("error", fmt.Sprintf("%s has mode %s: group or world may read it", path, perm)).
			Str("outcome", "loaded").Msg("key file is not private: chmod 600 it")
	}
	b, err := io.ReadAll(io.LimitReader(f, 1024))
	if err != nil {
		return none, fmt.Errorf("read key file %s: %w", path, errors.Unwrap(err))
	}
	raw, err := contracts.DecodeKey32(strings.TrimSpace(string(b)))
	if err != nil {
		return none, fmt.Errorf("key file %s: %w", path, err)
	}
	return raw, nil
}

// LoadOrCreateFile loads path (as LoadFile), creating it with a new key (as WriteNewFile) when it
// does not exist, so that nodes' credentials survive a relay restart.
func LoadOrCreateFile(path string, log zerolog.Logger) (Pair, error) {
	k, err := LoadFile(path, log)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	k, err = WriteNewFile(path)
	if errors.Is(err, ErrFileExists) { // created concurrently
		return LoadFile(path, log)
	}
	return k, err
}
