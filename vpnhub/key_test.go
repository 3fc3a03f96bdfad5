package vpnhub

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/contracts"
)

func TestKeyFileLifecycle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hub.key")
	k, err := LoadOrCreateKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v; want 0600", st.Mode().Perm(), err)
	}
	again, err := LoadOrCreateKeyFile(path)
	if err != nil || again.Public != k.Public || again.Private() != k.Private() {
		t.Fatal("a second load produced another key: credentials would not survive a restart")
	}
	if _, err := WriteNewKeyFile(path); !errors.Is(err, ErrKeyFileExists) {
		t.Fatalf("overwrote an existing key file: %v", err)
	}
	priv := k.Private()
	if s := fmt.Sprintf("%v %+v %s", k, k, k); strings.Contains(s, contracts.EncodeKey32(priv)) {
		t.Fatalf("the private key printed: %s", s)
	}
}

func TestLoadKeyFileRefusesGarbageWithoutQuotingIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hub.key")
	os.WriteFile(path, []byte("not-a-key-SECRETISH\n"), 0o600)
	_, err := LoadKeyFile(path)
	if err == nil || strings.Contains(err.Error(), "SECRETISH") || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v", err)
	}
}
