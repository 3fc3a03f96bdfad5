#!/usr/bin/env bash
# Builds kube-apiserver v1.37.2 and etcd v3.6.16 from the Go module proxy for the relay's HA
# tests (testenv/kubeapi) and caches them in
#   ${RELAY_KUBE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/relay-ci/kube-v1.37.2}
# It needs only Go and the module proxy. A binary already cached that answers --version is kept.
# Each binary is built into a temporary directory beside the cache and renamed into place, so an
# interrupted build never leaves a half-written binary behind.
#
# Measured on a 2-core machine shared with other builds and tests (load average 6-8), module
# downloads included: from empty module and build caches, etcd in 188 s and kube-apiserver in
# 756 s (16 min wall in all, at nice 19); with the machine's existing build cache, 82 s and
# 522 s (10 min).
# It adds 826 MB to the module cache (157 MB of it the downloaded zips) and about 2.9 GB to the
# build cache (go clean -cache reclaims it); peak RSS 2.3 GB. The binaries: kube-apiserver
# 119 MB, etcd 27 MB. A run with both cached takes 0.2 s. Started by the Go harness, etcd
# is ready in under 0.1 s and kube-apiserver 2.6-4.7 s later (under that load), at about
# 285 MB RSS (etcd 41 MB).
set -euo pipefail

export GOTOOLCHAIN=local
KUBE_VERSION=v1.37.2    # k8s.io/kubernetes
STAGING_VERSION=v0.37.2 # the k8s.io/* staging modules published with it
ETCD_VERSION=v3.6.16    # go.etcd.io/etcd/server/v3

dir=${RELAY_KUBE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/relay-ci/kube-${KUBE_VERSION}}
mkdir -p "$dir"
work=$(mktemp -d "${TMPDIR:-/tmp}/relay-kube-build.XXXXXX")
stage=$(mktemp -d "$dir/.build.XXXXXX") # same file system as $dir: the final mv is a rename
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work" "$stage"' EXIT

say() { printf 'build.sh: %s\n' "$*" >&2; }

# retry CMD...: runs CMD up to 4 times, 5, 10 and 20 s apart, for the module proxy's transient
# failures; each failure is said, and the last one ends the script loudly.
retry() {
	local n rc delay=5
	for n in 1 2 3 4; do
		"$@" && return 0
		rc=$?
		if ((n == 4)); then
			say "FAILED after $n tries (exit $rc): $*"
			return "$rc"
		fi
		say "try $n failed (exit $rc): $*; again in ${delay}s"
		sleep "$delay"
		delay=$((delay * 2))
	done
}

# No inlining: the compile takes about 15% less CPU (measured on client-go's clientset, 282 → 241
# CPU-s, the largest share of a cold CI run), at some cost in the binaries' speed, which the tests
# that start them do not measure.
gcflags=all=-l

# works NAME: the cached binary exists and runs.
works() { [[ -x "$dir/$1" ]] && "$dir/$1" --version >/dev/null 2>&1; }

# fetch MODULE@VERSION DEST: a writable copy of a module's source (read-only in the module cache).
fetch() {
	local json src
	json=$(retry go mod download -json "$1") || { say "cannot download $1 from the module proxy ($(go env GOPROXY))"; exit 1; }
	src=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")
	[[ -n "$src" && -d "$src" ]] || { say "go mod download $1 gave no directory"; exit 1; }
	cp -r "$src" "$2"
	chmod -R u+w "$2"
}

# relative_replaces: the module paths that go.mod in the current directory replaces with a
# directory path (./x or ../x), which a module downloaded alone does not have.
relative_replaces() {
	sed -n -E 's/^[[:space:]]*(replace[[:space:]]+)?([^[:space:]]+)([[:space:]]+[^[:space:]=]+)?[[:space:]]*=>[[:space:]]*\.\.?\/.*/\2/p' go.mod
}

# published_at MODULE VERSION: the module proxy serves MODULE at VERSION. "Not found" is an answer;
# any other failure (the proxy unreachable, a 5xx) is retried, and in the end fails the script
# instead of being taken for "not published".
published_at() {
	local out n
	for n in 1 2 3 4; do
		out=$(GOFLAGS=-mod=mod go list -m "$1@$2" 2>&1) && return 0
		if grep -Eq 'not found|unknown revision|invalid version|no matching versions' <<<"$out"; then
			return 1
		fi
		say "try $n: cannot ask the module proxy for $1@$2: $out"
		sleep $((5 * n))
	done
	say "FAILED: the module proxy did not say whether $1@$2 is published"
	exit 1
}

build_kube_apiserver() {
	say "kube-apiserver $KUBE_VERSION: fetching k8s.io/kubernetes"
	local src=$work/kubernetes
	fetch "k8s.io/kubernetes@$KUBE_VERSION" "$src"
	cd "$src"
	# No workspace, and no vendor/ (it holds only an OWNERS file): modules come from the proxy.
	rm -rf go.work go.work.sum vendor
	# The module zip has no staging/ tree: point each staging module at its published release.
	# A staging module not published at that version (sample-cli-plugin and sample-controller
	# were not, when this was written; kube-apiserver imports neither) loses its replace and its
	# requirement, and -mod=mod resolves it by MVS should anything import it.
	local mod published=() missing=()
	for mod in $(relative_replaces); do
		if published_at "$mod" "$STAGING_VERSION"; then
			published+=("-replace=$mod=$mod@$STAGING_VERSION")
		else
			missing+=("$mod")
			go mod edit -dropreplace="$mod" -droprequire="$mod"
		fi
	done
	((${#published[@]})) && go mod edit "${published[@]}"
	say "kube-apiserver: ${#published[@]} staging modules at $STAGING_VERSION; not published, dropped: ${missing[*]:-none}"
	local ldflags="-s -w" v
	for v in "gitVersion=$KUBE_VERSION" gitMajor=1 "gitMinor=$(cut -d. -f2 <<<"$KUBE_VERSION")" \
		gitTreeState=clean "buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
		ldflags+=" -X k8s.io/component-base/version.$v -X k8s.io/client-go/pkg/version.$v"
	done
	say "kube-apiserver: go build ./cmd/kube-apiserver (minutes: it is a large program)"
	local start=$SECONDS
	GOFLAGS=-mod=mod CGO_ENABLED=0 retry go build -trimpath -gcflags="$gcflags" -ldflags="$ldflags" -o "$stage/kube-apiserver" ./cmd/kube-apiserver
	mv -f "$stage/kube-apiserver" "$dir/kube-apiserver"
	say "kube-apiserver: built in $((SECONDS - start)) s"
}

build_etcd() {
	say "etcd $ETCD_VERSION: fetching go.etcd.io/etcd/server/v3"
	local src=$work/etcd
	fetch "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "$src"
	cd "$src"
	# Its go.mod replaces the sibling modules of the etcd repository by directory; the required
	# published versions (the same release) take their place.
	local mod
	for mod in $(relative_replaces); do
		go mod edit -dropreplace="$mod"
	done
	say "etcd: go build ."
	local start=$SECONDS
	GOFLAGS=-mod=mod CGO_ENABLED=0 retry go build -trimpath -gcflags="$gcflags" -ldflags="-s -w" -o "$stage/etcd" .
	mv -f "$stage/etcd" "$dir/etcd"
	say "etcd: built in $((SECONDS - start)) s"
}

if works etcd; then say "etcd: cached, kept"; else (build_etcd); fi
if works kube-apiserver; then say "kube-apiserver: cached, kept"; else (build_kube_apiserver); fi
works etcd || { say "etcd does not run: $dir/etcd"; exit 1; }
works kube-apiserver || { say "kube-apiserver does not run: $dir/kube-apiserver"; exit 1; }
say "ready:"
printf '%s\n' "$dir/kube-apiserver" "$dir/etcd"
