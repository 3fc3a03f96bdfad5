#!/usr/bin/env bash
# Installs the conformance suite's Node.js packages into interop/node_modules (not committed):
#   - ws, pinned by package-lock.json (npm ci);
#   - the published @api.global/typedrequest, pinned to one version and checked against the
#     registry's integrity for it. Its own dependency tree does not resolve on the registry, so
#     it is not an npm dependency: its tarball is packed and only the self-contained ESM bundle it
#     ships (dist_bundle/bundle.js) is unpacked, unchanged, into
#     node_modules/@api.global/typedrequest/.
# Needs node and npm. Runs again in well under a second when everything is in place.
set -euo pipefail
cd "$(dirname "$0")"

version=3.3.0
integrity='sha512-Jwobqla+9k2IBG0duwrCFtc6GU6wsvHS3f0gJJsxTrpapylBW1YSF7NnGHPGs7F9hbATsO6IoUBpR2ScoKyGJA=='
dest=node_modules/@api.global/typedrequest
marker=$dest/.interop-$version

if [ -f "$marker" ] && [ -f node_modules/ws/package.json ] &&
  grep -q '"version": "8.23.0"' node_modules/ws/package.json; then
  echo "interop: packages present"
  exit 0
fi

# retry CMD...: runs CMD up to 4 times, 5, 10 and 20 s apart, for the registry's transient
# failures; each failure is said, and the last one ends the script loudly.
retry() {
  local n rc delay=5
  for n in 1 2 3 4; do
    "$@" && return 0
    rc=$?
    if [ "$n" = 4 ]; then
      echo "interop: FAILED after $n tries (exit $rc): $*" >&2
      return "$rc"
    fi
    echo "interop: try $n failed (exit $rc): $*; again in ${delay}s" >&2
    sleep "$delay"
    delay=$((delay * 2))
  done
}

retry npm ci --ignore-scripts --no-audit --no-fund --loglevel=error

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
retry npm pack "@api.global/typedrequest@$version" --pack-destination "$tmp" --loglevel=error >/dev/null
tarball=$tmp/api.global-typedrequest-$version.tgz
got=$(node -e 'const c=require("crypto"),fs=require("fs");
  process.stdout.write("sha512-"+c.createHash("sha512").update(fs.readFileSync(process.argv[1])).digest("base64"))' "$tarball")
if [ "$got" != "$integrity" ]; then
  echo "interop: @api.global/typedrequest@$version tarball has integrity $got, want $integrity" >&2
  exit 1
fi
rm -rf "$dest"
mkdir -p "$dest"
tar -xzf "$tarball" -C "$dest" --strip-components=1 package/package.json package/license package/dist_bundle/bundle.js
touch "$marker"
echo "interop: installed ws 8.23.0 and @api.global/typedrequest $version (dist_bundle)"
