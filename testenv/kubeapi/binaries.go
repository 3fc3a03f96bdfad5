package kubeapi

import (
	"os"
	"path/filepath"
	"testing"
)

// Version is the Kubernetes release the cached kube-apiserver is built from.
const Version = "v1.37.2"

// BuildCommand is the one command, run at the module root, that builds and caches the binaries.
const BuildCommand = "bash testenv/kubeapi/build.sh"

// Binaries returns the directory build.sh caches kube-apiserver and etcd in,
// ${RELAY_KUBE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/relay-ci/kube-v1.37.2}, and whether
// both are there and executable.
func Binaries() (dir string, ok bool) {
	dir = os.Getenv("RELAY_KUBE_BIN_DIR")
	if dir == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			cache = filepath.Join(os.Getenv("HOME"), ".cache")
		}
		dir = filepath.Join(cache, "relay-ci", "kube-"+Version)
	}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o100 == 0 {
			return dir, false
		}
	}
	return dir, true
}

// Require returns the binaries' directory, or ends the test when they are missing: it skips,
// naming the command that builds them, unless RELAY_REQUIRE_KUBE=1 (CI sets it), when it fails.
func Require(t testing.TB) string {
	t.Helper()
	dir, ok := Binaries()
	if ok {
		return dir
	}
	msg := "kube-apiserver and etcd are not built in " + dir + "; build them with: " + BuildCommand
	if os.Getenv("RELAY_REQUIRE_KUBE") == "1" {
		t.Fatal(msg + " (RELAY_REQUIRE_KUBE=1: a missing control plane is a failure)")
	}
	t.Skip(msg)
	return dir
}
