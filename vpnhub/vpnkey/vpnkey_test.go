package vpnkey

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"code.foss.global/serve.zone/relay/contracts"
)

func TestKeyFile(t *testing.T) {
	t.Run("created 0600 and loaded again", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "hub.key")
		k, err := LoadOrCreateFile(path, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(path)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("key file mode %v, %v; want 0600", st.Mode().Perm(), err)
		}
		again, err := LoadOrCreateFile(path, zerolog.Nop())
		if err != nil || again.Public != k.Public || again.Private() != k.Private() {
			t.Fatal("a second load produced another key: credentials would not survive a restart")
		}
		if _, err := WriteNewFile(path); !errors.Is(err, ErrFileExists) {
			t.Fatalf("overwrote an existing key file: %v", err)
		}
	})

	// A created key file reaches the disk, with its directory entry, before
	// the hub reports the key; a crash must not leave an empty file or none.
	t.Run("synced with its directory when created", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "hub.key")
		var synced []string
		fsync = func(f *os.File) error {
			st, _ := f.Stat()
			if !st.IsDir() && st.Size() == 0 {
				t.Error("synced before the key was written")
			}
			synced = append(synced, f.Name())
			return f.Sync()
		}
		t.Cleanup(func() { fsync = (*os.File).Sync })
		if _, err := WriteNewFile(path); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(synced, []string{path, dir}) {
			t.Fatalf("synced %q; want the file, then its directory", synced)
		}

		fsync = func(*os.File) error { return errors.New("disk on fire") }
		failed := filepath.Join(dir, "failed.key")
		if _, err := WriteNewFile(failed); err == nil {
			t.Fatal("a key file that could not be synced was reported written")
		}
		if _, err := os.Lstat(failed); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("an unsynced key file was left behind: %v", err)
		}
	})

	// The key file is opened without following a symbolic link, so a link
	// planted at its path can neither hand the hub another key nor make it write one elsewhere.
	t.Run("a symbolic link is refused", func(t *testing.T) {
		dir := t.TempDir()
		real := filepath.Join(dir, "real.key")
		if _, err := WriteNewFile(real); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(dir, "hub.key")
		if err := os.Symlink(real, link); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadOrCreateFile(link, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Fatalf("loaded a key through a symbolic link: %v", err)
		}
		dangling := filepath.Join(dir, "dangling.key")
		target := filepath.Join(dir, "elsewhere.key")
		if err := os.Symlink(target, dangling); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadOrCreateFile(dangling, zerolog.Nop()); err == nil {
			t.Fatal("created a key through a dangling symbolic link")
		}
		if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a key was written where the link points: %v", err)
		}
	})

	// A key file group or world may read is loaded (the node credentials
	// name its key) with a warning.
	t.Run("group or world access is warned about", func(t *testing.T) {
		dir := t.TempDir()
		for mode, warn := range map[os.FileMode]bool{0o600: false, 0o400: false, 0o640: true, 0o604: true, 0o660: true} {
			path := filepath.Join(dir, fmt.Sprintf("hub-%o.key", mode))
			k, err := WriteNewFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, mode); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			got, err := LoadFile(path, zerolog.New(&buf))
			if err != nil || got.Public != k.Public {
				t.Fatalf("mode %o: %v", mode, err)
			}
			warned := strings.Contains(buf.String(), `"level":"warn"`) && strings.Contains(buf.String(), path)
			if warned != warn {
				t.Errorf("mode %o: warned %v, want %v: %s", mode, warned, warn, buf.String())
			}
			priv := k.Private()
			if strings.Contains(buf.String(), contracts.EncodeKey32(priv)) {
				t.Fatal("the warning quotes the private key")
			}
		}
	})

	t.Run("garbage is refused without quoting it", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "hub.key")
		os.WriteFile(path, []byte("not-a-key-SECRETISH\n"), 0o600)
		_, err := LoadFile(path, zerolog.Nop())
		if err == nil || strings.Contains(err.Error(), "SECRETISH") || !strings.Contains(err.Error(), path) {
			t.Fatalf("err = %v", err)
		}
	})
}

// A Pair "prints nothing of the private half"; %#v, on the key or on a struct that holds it, is
// printing too.
func TestPairPrintsNoPrivateKey(t *testing.T) {
	k, err := FromPrivate([32]byte{7, 0x42, 7, 7})
	if err != nil {
		t.Fatal(err)
	}
	priv := k.Private()
	first := fmt.Sprintf("%#v", priv[:4]) // the first private bytes as %#v renders them
	first = first[len("[]byte{") : len(first)-1]
	holder := struct{ Key Pair }{k}
	for _, s := range []string{fmt.Sprintf("%v %+v %s", k, k, k), fmt.Sprintf("%#v", k), fmt.Sprintf("%#v %+v", holder, holder)} {
		if strings.Contains(s, contracts.EncodeKey32(priv)) || strings.Contains(s, first) {
			t.Fatalf("the private key printed: %s", s)
		}
	}
}
