#!/usr/bin/env bash
# The fuzzing campaign over every decoder that reads a peer's bytes: each target runs for
# MINUTES minutes (default 10), two at a time, one worker each. What the fuzzer found interesting
# is kept as seed corpus in <package>/testdata/fuzz/<Target>/, so every `go test` replays it; a
# crasher stays there as a regression case. Figures go to bench/results/fuzz.md.
#   bash bench/fuzz.sh [MINUTES]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-10}
module=$(go list -m)
cache="$(go env GOCACHE)/fuzz"
out=bench/results/fuzz.md
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

targets=(
  "./internal/typedsocket FuzzDecode"
  "./contracts FuzzFindStreamMarkers"
  "./relay FuzzStreamFrameRouting"
  "./contracts FuzzReadProtocolOffer"
  "./contracts/strictjson FuzzCanonicalize"
  "./contracts FuzzRelayReaders"
  "./contracts FuzzReadClusterIngressRegistration"
  "./contracts FuzzReadHoldRuntimeNetworkDnsLeaseRenewalsRequest"
  "./contracts FuzzNormalizeIsolatedRestoreProgress"
  "./contracts FuzzProjectIsolatedRestoreProgress"
  "./contracts FuzzReadVPNMembershipPush"
  "./contracts FuzzIngressReaders"
  "./ingress FuzzDecodeCursor"
  "./registry FuzzParsePath"
  "./vpnhub FuzzHandshakeMessage"
  "./vpnhub FuzzHandshakePayload"
  "./vpnhub FuzzDatagram"
  "./bench/forwarder FuzzLocate"
)

run_one() {
  local pkg=$1 name=$2 log="$work/$2.log" start status
  start=$(date +%s)
  if go test -run '^$' -fuzz "^${name}\$" -fuzztime "${minutes}m" -parallel 1 "$pkg" >"$log" 2>&1; then status=ok; else status=FAILED; fi
  local last execs found
  last=$(grep -E '^fuzz: elapsed' "$log" | tail -n 1 || true)
  execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
  # Keep what the fuzzer found interesting as seed corpus.
  local from="$cache/$module/${pkg#./}/$name" to="$pkg/testdata/fuzz/$name"
  mkdir -p "$to"
  [ -d "$from" ] && cp -n "$from"/* "$to"/ 2>/dev/null || true
  found=$(ls "$to" | wc -l)
  printf '| `%s` | `%s` | %s | %s | %s | %s |\n' "${pkg#./}" "$name" "$(( ($(date +%s) - start) / 60 ))" "${execs:-?}" "$found" "$status" >"$work/$name.row"
  if [ "$status" != ok ]; then
    echo "== $name failed:"; tail -n 30 "$log"
  fi
}
export -f run_one
export minutes module cache work

printf '%s\n' "${targets[@]}" | xargs -P 2 -L 1 bash -c 'run_one "$0" "$1"'

{
  echo "# Fuzzing campaign"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; $(go version | cut -d' ' -f3)"
  echo "- command: \`bash bench/fuzz.sh $minutes\` (each target ${minutes} minutes, one worker, two targets at a time)"
  echo
  echo "| package | target | minutes | executions | corpus kept in testdata/fuzz | result |"
  echo "| --- | --- | --- | --- | --- | --- |"
  for t in "${targets[@]}"; do cat "$work/${t#* }.row"; done
} >"$out"
cat "$out"
